"""SingleAgentEpisode: building, getters/setters across the lookback, numpy mode, cut/concat/slice, state.

Expected values of cut(), slice() and the getters were checked against RLlib 2.60.
"""

import copy

import gymnasium as gym
import numpy as np
import pytest

from rlgate.core.columns import Columns
from rlgate.episodes import InfiniteLookbackBuffer, SingleAgentEpisode


def values(x):
    if isinstance(x, dict):
        return {k: values(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [values(v) for v in x]
    return np.asarray(x).tolist()


def episode_with_lookback(**kwargs) -> SingleAgentEpisode:
    """Observations 0..5 of which 0 and 1 are lookback (t_started=2), actions 10.., rewards 0.1.."""
    return SingleAgentEpisode(
        observations=[0, 1, 2, 3, 4, 5],
        actions=[10, 11, 12, 13, 14],
        rewards=[0.5, 1.0, 1.5, 2.0, 2.5],
        extra_model_outputs={Columns.VF_PREDS: [0.0, 0.1, 0.2, 0.3, 0.4]},
        len_lookback_buffer=2,
        t_started=2,
        **kwargs,
    )


def run_steps(episode: SingleAgentEpisode, observations, start: int = 0, done_at: int | None = None) -> None:
    for i, obs in enumerate(observations, start):
        episode.add_env_step(
            obs,
            i % 2,
            float(i),
            {"step": i},
            terminated=i == done_at,
            extra_model_outputs={Columns.ACTION_LOGP: np.float32(-i), Columns.VF_PREDS: np.float32(i)},
        )


# --- construction -----------------------------------------------------------------------------------------


def test_fresh_episode_defaults():
    episode = SingleAgentEpisode()
    assert len(episode.id_) == 32 and int(episode.id_, 16) >= 0
    assert SingleAgentEpisode().id_ != episode.id_
    assert (len(episode), episode.t, episode.t_started, episode.chunk_index) == (0, 0, 0, 0)
    assert not (episode.is_reset or episode.is_done or episode.is_numpy)
    assert episode.get_return() == 0.0 and episode.get_duration_s() == 0.0
    assert episode.extra_model_outputs == {} and episode.custom_data == {}


def test_len_lookback_buffer_auto_makes_all_data_lookback():
    episode = SingleAgentEpisode(observations=[0, 1, 2], actions=[0, 1], rewards=[1.0, 1.0], t_started=7)
    assert len(episode) == 0 and episode.t == episode.t_started == 7
    assert episode.observations.lookback == 2 and values(episode.get_observations()) == [2]
    assert episode.is_reset


def test_len_lookback_buffer_int_and_clamping():
    episode = SingleAgentEpisode(observations=[0, 1, 2], actions=[0, 1], rewards=[1.0, 1.0], len_lookback_buffer=1)
    assert len(episode) == 1 and episode.t == 1
    assert values(episode.get_observations()) == [1, 2]
    clamped = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[1.0], len_lookback_buffer=9)
    assert clamped.observations.lookback == 1 and len(clamped) == 0


def test_constructor_defaults_infos_and_keeps_ids():
    episode = SingleAgentEpisode(
        "abc", observations=[0, 1], actions=[1], rewards=[2.0], len_lookback_buffer=0, agent_id="a0",
        module_id="m", multi_agent_episode_id="ma",
    )  # fmt: skip
    assert episode.get_infos() == [{}, {}]
    assert (episode.id_, episode.agent_id, episode.module_id, episode.multi_agent_episode_id) == (
        "abc",
        "a0",
        "m",
        "ma",
    )


def test_constructor_from_arrays_is_numpy():
    episode = SingleAgentEpisode(
        observations=np.arange(4, dtype=np.float32),
        actions=np.array([0, 1, 0]),
        rewards=np.ones(3, np.float32),
        len_lookback_buffer=0,
    )
    assert episode.is_numpy and len(episode) == 3 and len(episode.get_infos()) == 4


def test_constructor_rejects_inconsistent_lengths():
    with pytest.raises(ValueError, match="actions"):
        SingleAgentEpisode(observations=[0, 1, 2], actions=[0], rewards=[1.0, 1.0], len_lookback_buffer=0)
    with pytest.raises(ValueError, match="vf_preds"):
        SingleAgentEpisode(
            observations=[0, 1], actions=[0], rewards=[1.0], extra_model_outputs={"vf_preds": []}, len_lookback_buffer=0
        )


# --- building step by step ----------------------------------------------------------------------------------


def test_add_env_reset_and_steps():
    episode = SingleAgentEpisode(observation_space=gym.spaces.Discrete(10), action_space=gym.spaces.Discrete(2))
    episode.add_env_reset(0, {"seed": 1})
    assert episode.is_reset and len(episode) == 0 and episode.get_infos() == [{"seed": 1}]
    run_steps(episode, [1, 2, 3])
    assert (len(episode), episode.t, episode.env_steps(), episode.agent_steps()) == (3, 3, 3, 3)
    assert episode.get_observations() == [0, 1, 2, 3]
    assert episode.get_actions() == [0, 1, 0]
    assert episode.get_return() == 3.0
    assert values(episode.get_extra_model_outputs(Columns.ACTION_LOGP)) == [0, -1, -2]
    assert episode.get_infos(-1) == {"step": 2}
    assert episode.get_duration_s() > 0.0
    episode.validate()


def test_add_env_step_defaults_infos_and_sets_done():
    episode = SingleAgentEpisode()
    episode.add_env_reset(0)
    episode.add_env_step(1, 0, 1.0, truncated=True)
    assert episode.get_infos() == [{}, {}] and episode.is_truncated and episode.is_done
    assert not episode.is_terminated and episode.extra_model_outputs == {}


def test_preconditions_raise():
    episode = SingleAgentEpisode()
    episode.add_env_reset(0)
    with pytest.raises(RuntimeError, match="fresh"):
        episode.add_env_reset(0)
    episode.add_env_step(1, 0, 1.0, terminated=True)
    with pytest.raises(RuntimeError, match="done"):
        episode.add_env_step(2, 0, 1.0)
    with pytest.raises(RuntimeError, match="done"):
        episode.cut()


def test_extra_output_added_mid_episode_fails_validation():
    episode = SingleAgentEpisode()
    episode.add_env_reset(0)
    episode.add_env_step(1, 0, 1.0)
    episode.add_env_step(2, 0, 1.0, extra_model_outputs={"late": 1.0})
    with pytest.raises(ValueError, match="late"):
        episode.validate()


# --- getters and setters across the lookback ---------------------------------------------------------------


def test_getters_across_the_lookback(in_mode):
    episode = in_mode(episode_with_lookback(observation_space=gym.spaces.Discrete(6)))
    assert (len(episode), episode.t_started, episode.t) == (3, 2, 5)
    assert values(episode.get_observations()) == [2, 3, 4, 5]
    assert values(episode.get_observations(-1)) == 5
    assert values(episode.get_observations(-1, neg_index_as_lookback=True)) == 1
    assert values(episode.get_observations(slice(-3, 1), neg_index_as_lookback=True, fill=-1)) == [-1, 0, 1, 2]
    assert values(episode.get_observations([-1, 0, 10], fill=9)) == [5, 2, 9]
    assert values(episode.get_actions(slice(-2, None), neg_index_as_lookback=True)) == [10, 11, 12, 13, 14]
    assert values(episode.get_rewards(slice(-4, 1), neg_index_as_lookback=True, fill=0.0)) == [0, 0, 0.5, 1.0, 1.5]
    assert values(episode.get_extra_model_outputs(Columns.VF_PREDS, -1, neg_index_as_lookback=True)) == 0.1
    assert values(episode.get_extra_model_outputs(Columns.VF_PREDS, 5, fill=0.0)) == 0.0
    assert values(episode.get_observations(-3, neg_index_as_lookback=True, fill=0, one_hot_discrete=True)) == [0] * 6
    assert values(episode.get_observations(0, one_hot_discrete=True)) == [0, 0, 1, 0, 0, 0]
    assert episode.get_infos(-1, neg_index_as_lookback=True) == {}
    assert episode.get_infos(9, fill={"pad": True}) == {"pad": True}
    assert episode.get_return() == pytest.approx(6.0)


def test_getters_on_nested_spaces(in_mode, nested_obs_space):
    nested_obs_space.seed(3)
    observations = [nested_obs_space.sample() for _ in range(4)]
    action_space = gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (1,), np.float32)])
    action_space.seed(4)
    actions = [action_space.sample() for _ in range(3)]
    episode = in_mode(
        SingleAgentEpisode(
            observations=observations, observation_space=nested_obs_space, actions=actions,
            action_space=action_space, rewards=[1.0, 2.0, 3.0], len_lookback_buffer=1,
        )
    )  # fmt: skip
    last = episode.get_observations(-1)
    np.testing.assert_array_equal(last["pos"], observations[-1]["pos"])
    assert int(last["inner"][0]) == int(observations[-1]["inner"][0])
    padded = episode.get_observations(slice(-3, 0), neg_index_as_lookback=True, fill=0, one_hot_discrete=True)
    if episode.is_numpy:
        assert padded["inner"][0].tolist() == [[0, 0, 0], [0, 0, 0], np.eye(3)[observations[0]["inner"][0]].tolist()]
        assert padded["pos"].shape == (3, 2) and padded["pos"].dtype == np.float32
    else:
        assert len(padded) == 3 and values(padded[0]["inner"][1]) == [0] * 6
    lookback_action = episode.get_actions(-1, neg_index_as_lookback=True)
    assert int(lookback_action[0]) == int(actions[0][0])
    assert values(episode.get_actions(one_hot_discrete=True)[0 if not episode.is_numpy else 1])  # non-empty


def test_setters(in_mode):
    episode = in_mode(episode_with_lookback())
    episode.set_observations(new_data=99, at_indices=-1, neg_index_as_lookback=True)
    episode.set_actions(new_data=[7, 8], at_indices=slice(1, 3))
    episode.set_rewards(new_data=[0.0, 0.0, 0.0])
    episode.set_extra_model_outputs(key=Columns.VF_PREDS, new_data=9.0, at_indices=0)
    assert values(episode.get_observations(slice(-2, 1), neg_index_as_lookback=True)) == [0, 99, 2]
    assert values(episode.get_actions()) == [12, 7, 8]
    assert episode.get_return() == 0.0
    assert values(episode.get_extra_model_outputs(Columns.VF_PREDS)) == pytest.approx([9.0, 0.3, 0.4])
    with pytest.raises(KeyError):
        episode.set_extra_model_outputs(key="nope", new_data=1.0, at_indices=0)


# --- numpy mode ------------------------------------------------------------------------------------------------


def test_to_numpy_then_keep_appending():
    episode = SingleAgentEpisode()
    episode.add_env_reset(np.zeros(3, np.float32))
    run_steps(episode, [np.full(3, i, np.float32) for i in range(1, 4)])
    assert episode.to_numpy() is episode and episode.is_numpy
    assert episode.get_observations().shape == (4, 3) and episode.get_observations().dtype == np.float32
    assert episode.get_extra_model_outputs(Columns.ACTION_LOGP).dtype == np.float32
    assert isinstance(episode.get_infos(), list)  # infos stay a list, as in RLlib
    run_steps(episode, [np.full(3, i, np.float32) for i in range(4, 40)], start=3)
    assert episode.get_observations().shape == (40, 3) and len(episode) == 39
    assert episode.get_observations(-1).tolist() == [39.0] * 3
    assert episode.get_actions().tolist() == [i % 2 for i in range(39)]
    episode.validate()


def test_to_numpy_on_empty_and_reset_only_episodes():
    empty = SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (2,), np.float32)).to_numpy()
    assert empty.is_numpy and empty.get_observations().shape == (0, 2)
    reset_only = SingleAgentEpisode()
    reset_only.add_env_reset(np.ones(2, np.float32))
    reset_only.to_numpy()
    reset_only.add_env_step(np.zeros(2, np.float32), 1, 0.5, extra_model_outputs={"x": np.float32(1)})
    assert reset_only.get_observations().shape == (2, 2) and values(reset_only.get_actions()) == [1]
    reset_only.validate()


# --- cut, concat, slice -----------------------------------------------------------------------------------------


def test_cut_without_lookback(in_mode):
    episode = in_mode(
        SingleAgentEpisode(observations=[0, 1, 2, 3], actions=[1, 2, 3], rewards=[1.0, 2.0, 3.0], len_lookback_buffer=0)
    )
    successor = episode.cut()
    assert (successor.id_, len(successor), successor.t_started, successor.t) == (episode.id_, 0, 3, 3)
    assert values(successor.observations.data) == [3] and successor.observations.lookback == 0
    assert values(successor.get_actions()) == [] and successor.chunk_index == 1


def test_cut_with_lookback_matches_rllib(in_mode):
    episode = in_mode(
        SingleAgentEpisode(observations=[0, 1, 2, 3], actions=[1, 2, 3], rewards=[1.0, 2.0, 3.0], len_lookback_buffer=0)
    )
    successor = episode.cut(len_lookback_buffer=2)
    assert values(successor.observations.data) == [1, 2, 3] and successor.observations.lookback == 2
    assert values(successor.actions.data) == [2, 3] and successor.actions.lookback == 2
    assert values(successor.get_actions(-1, neg_index_as_lookback=True)) == 3
    assert (len(successor), successor.t_started) == (0, 3)
    longer = episode.cut(len_lookback_buffer=10)  # more than available: takes what there is
    assert values(longer.observations.data) == [0, 1, 2, 3] and longer.observations.lookback == 3
    assert values(longer.rewards.data) == [1.0, 2.0, 3.0] and longer.rewards.lookback == 3
    with pytest.raises(ValueError):
        episode.cut(len_lookback_buffer=-1)


def test_cut_copies_custom_data_and_ids():
    episode = SingleAgentEpisode(agent_id="a", module_id="m")
    episode.add_env_reset(0)
    episode.custom_data["list"] = [1]
    successor = episode.cut()
    successor.custom_data["list"].append(2)
    assert episode.custom_data["list"] == [1]
    assert (successor.agent_id, successor.module_id) == ("a", "m")
    assert successor.cut().chunk_index == 2


@pytest.mark.parametrize("lookback", [0, 1, 3])
def test_cut_then_concat_equals_uncut(in_mode, lookback, nested_obs_space, assert_episodes_equal):
    nested_obs_space.seed(0)
    observations = [nested_obs_space.sample() for _ in range(10)]
    whole = SingleAgentEpisode("same", observation_space=nested_obs_space)
    first = SingleAgentEpisode("same", observation_space=nested_obs_space)
    for episode in (whole, first):
        episode.add_env_reset(observations[0])
    run_steps(whole, observations[1:], done_at=8)
    run_steps(first, observations[1:5])
    first = in_mode(first)
    second = first.cut(len_lookback_buffer=lookback)
    second.custom_data["from_second"] = True
    run_steps(second, observations[5:], start=4, done_at=8)
    first.concat_episode(second)
    assert first.is_terminated and first.custom_data == {"from_second": True}
    assert_episodes_equal(first, whole)


def test_concat_rejects_mismatches():
    episode = SingleAgentEpisode("e")
    episode.add_env_reset(0)
    run_steps(episode, [1, 2])
    follower = episode.cut()
    with pytest.raises(ValueError, match="cannot concat"):
        episode.concat_episode(SingleAgentEpisode("other"))
    wrong_t = episode.cut()
    wrong_t.t_started = 5
    with pytest.raises(ValueError, match="t="):
        episode.concat_episode(wrong_t)
    wrong_obs = episode.cut()
    wrong_obs.set_observations(new_data=7, at_indices=0)
    with pytest.raises(ValueError, match="observation"):
        episode.concat_episode(wrong_obs)
    unknown = episode.cut()
    run_steps(unknown, [3])
    unknown.extra_model_outputs["new"] = InfiniteLookbackBuffer([0.0])
    with pytest.raises(ValueError, match="new"):
        episode.concat_episode(unknown)
    episode.add_env_step(
        3, 0, 0.0, terminated=True, extra_model_outputs={Columns.ACTION_LOGP: 0.0, Columns.VF_PREDS: 0.0}
    )
    with pytest.raises(RuntimeError, match="done"):
        episode.concat_episode(follower)


def test_slice_rllib_docstring_example(in_mode):
    episode = in_mode(
        SingleAgentEpisode(
            observations=[0, 1, 2, 3, 4, 5],
            actions=[1, 2, 3, 4, 5],
            rewards=[0.1, 0.2, 0.3, 0.4, 0.5],
            len_lookback_buffer=0,
        )
    )
    first = episode[:1]
    assert values(first.get_observations()) == [0, 1] and values(first.get_actions()) == [1]
    assert values(first.get_rewards()) == [0.1]
    last = episode[-2:]
    assert values(last.get_observations()) == [3, 4, 5] and values(last.get_actions()) == [4, 5]
    assert last.t_started == 3 and len(last) == 2


def test_slice_takes_lookback_and_keeps_done_only_at_the_end(in_mode):
    episode = in_mode(episode_with_lookback(terminated=True))
    middle = episode[0:2]
    assert (middle.t_started, len(middle), middle.is_terminated) == (2, 2, False)
    assert values(middle.observations.data) == [0, 1, 2, 3, 4] and middle.observations.lookback == 2
    assert values(middle.actions.data) == [10, 11, 12, 13] and middle.actions.lookback == 2
    assert values(middle.get_extra_model_outputs(Columns.VF_PREDS)) == pytest.approx([0.2, 0.3])
    wide = episode.slice(slice(1, 3), len_lookback_buffer=10)  # clamped to what exists
    assert wide.observations.lookback == 3 and values(wide.observations.data) == [0, 1, 2, 3, 4, 5]
    assert episode.slice(slice(0, 3), len_lookback_buffer=0).observations.lookback == 0
    tail = episode[1:]
    assert tail.is_terminated and len(tail) == 2
    with pytest.raises(ValueError, match="step"):
        episode[::2]
    with pytest.raises(NotImplementedError):
        episode[0]


# --- state and summaries -----------------------------------------------------------------------------------------


def test_state_round_trip(in_mode, nested_obs_space, assert_episodes_equal):
    nested_obs_space.seed(1)
    episode = SingleAgentEpisode(observation_space=nested_obs_space, action_space=gym.spaces.Discrete(2), agent_id="a")
    episode.add_env_reset(nested_obs_space.sample(), {"i": 0})
    run_steps(episode, [nested_obs_space.sample() for _ in range(5)])
    episode = in_mode(episode.cut(len_lookback_buffer=2))
    run_steps(episode, [nested_obs_space.sample() for _ in range(3)], start=5)
    episode.custom_data["k"] = "v"
    state = episode.get_state()
    assert state["chunk_index"] == 1 and state["_observation_space"] == nested_obs_space
    restored = SingleAgentEpisode.from_state(copy.deepcopy(state))
    assert_episodes_equal(restored, episode)
    assert restored.observation_space == nested_obs_space and restored.observations.space == nested_obs_space
    assert restored.custom_data == {"k": "v"} and restored.agent_id == "a"
    assert restored.get_duration_s() == episode.get_duration_s() and restored.is_numpy == episode.is_numpy


def test_repr_and_summaries():
    episode = episode_with_lookback()
    assert repr(episode) == f"SAEps(len=3 done=False R=6.0 id_={episode.id_})"
    assert isinstance(episode.get_return(), float)
    assert episode.env_steps() == episode.agent_steps() == 3
