"""The episode codec micro benchmark runs and reports what it promises (tiny sizes; timings not checked)."""

from rlgate.bench.episodes_codec import cartpole_episode, run


def test_run_reports_all_figures():
    result = run(steps=20, repeats=3)
    assert result["steps"] == 20 and result["message_bytes"] > 20 * 4 * 4
    for key in ("encode_us", "decode_us", "encode_numpy_episode_us", "add_env_step_us"):
        assert result[key] > 0
    assert abs(result["total_us"] - (result["encode_us"] + result["decode_us"])) <= 0.2


def test_cartpole_episode_shape():
    episode = cartpole_episode(7)
    assert len(episode) == 7 and not episode.is_numpy
    assert sorted(episode.extra_model_outputs) == ["action_dist_inputs", "action_logp", "model_version"]
