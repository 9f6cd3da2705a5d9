"""Presets: tuned run specs for the classic-control and Box2D envs, the base a spec for such an env starts from."""

from __future__ import annotations

import pytest

from rlgate.cli.up import UpSettings
from rlgate.learner.settings import LearnerSettings
from rlgate.spec.algorithm import PPOConfig, scheduled
from rlgate.spec.build import build_env_to_module, build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.presets import preset, preset_for, preset_names
from rlgate.spec.run import RunSpec


@pytest.mark.parametrize(("algorithm", "name"), [(a, name) for a in ("PPO", "DQN", "SAC") for name in preset_names(a)])
def test_every_preset_is_a_valid_spec_for_its_env_and_says_where_its_values_come_from(
    algorithm: str, name: str
) -> None:
    spec = RunSpec.parse(preset(name, algorithm), name)
    assert preset_for(spec.env.id, algorithm) == name and spec.algorithm.name == algorithm  # (ALE) its namespace's
    from importlib import resources

    folder = resources.files("rlgate.spec") / "presets"
    text = (folder / f"{name}.toml" if algorithm == "PPO" else folder / algorithm / f"{name}.toml").read_text()
    assert "rl-baselines3-zoo" in text
    needs = {"LunarLander": ("Box2D", "box2d"), "ALE": ("ale_py", "atari"), "MiniGrid": ("minigrid", "minigrid")}
    for prefix, (module, extra) in needs.items():
        if name.startswith(prefix):
            pytest.importorskip(module, reason=f"{name} needs {module} (pip install 'rlgate[{extra}]')")
    from rlgate.spec.env import env_spaces

    spaces = env_spaces(spec.env, ImportPolicy(spec.modules()))
    pipeline = build_env_to_module(spec, *spaces, ImportPolicy())
    module = build_rl_module(spec, pipeline.observation_space, spaces[1], ImportPolicy())
    build_learner_connector(spec, module.observation_space, module.action_space, ImportPolicy())


def test_an_env_with_a_preset_starts_from_it_and_the_file_and_flags_go_on_top(tmp_path) -> None:
    assert LearnerSettings(env="Pendulum-v1").spec.algorithm.gamma == 0.9  # the preset
    assert LearnerSettings(env="Pendulum-v1", preset="none").spec.algorithm.gamma == 0.98  # the defaults
    flagged = LearnerSettings(_cli_parse_args=["--env", "Pendulum-v1", "--spec.algorithm.gamma", "0.95"])
    assert flagged.spec.algorithm.gamma == 0.95 and flagged.spec.algorithm.train_batch_size == 4096
    (tmp_path / "run.toml").write_text('[env]\nid = "Acrobot-v1"\n[algorithm]\nnum_epochs = 2\n')
    filed = LearnerSettings(config=tmp_path / "run.toml").spec
    assert filed.algorithm.num_epochs == 2 and filed.connectors.learner[0].type == "NormalizeRewards"
    assert UpSettings().spec.algorithm.train_batch_size == 256  # `rlgate up`'s CartPole is rl-zoo's
    assert UpSettings(env="Acrobot-v1").spec.env.num_envs == 16  # the preset over up's own default of 8
    with pytest.raises(ValueError, match=r"no preset .Pong."):
        LearnerSettings(env="Acrobot-v1", preset="Pong")


def test_the_start_up_log_says_which_preset_applied_or_that_none_did() -> None:
    """An env without a preset silently got the defaults (one sub-env, PPO tuned for CartPole): now said."""
    assert LearnerSettings(env="Pendulum-v1").preset_line() == (
        "run spec: the Pendulum-v1 preset (settings tuned for it), with the file and flags over it"
    )
    assert LearnerSettings(env="ALE/Breakout-v5").preset == "ALE"  # the preset that applied, not "auto"
    none = "no preset for {}: what the file and flags leave unset is the spec's default (the algorithm's, tuned "
    assert none.format("mypkg:MyEnv") in LearnerSettings(env="mypkg:MyEnv").preset_line()
    assert LearnerSettings(env="mypkg:MyEnv").preset_line().endswith("for CartPole-v1; env.num_envs 1)")
    assert (
        LearnerSettings(env="Pendulum-v1", preset="none")
        .preset_line()
        .startswith(f"run spec: {none.format('Pendulum-v1')}")
    )


def test_the_algorithm_named_picks_its_presets_and_an_env_without_one_starts_from_the_defaults() -> None:
    dqn = UpSettings(_cli_parse_args=["--algo", "DQN"]).spec  # up's CartPole
    assert dqn.algorithm.name == "DQN" and dqn.model.config["fcnet_hiddens"] == [256, 256]
    assert LearnerSettings(env="Pendulum-v1", algo="SAC").spec.algorithm.actor_lr == 1e-3
    assert LearnerSettings(env="Acrobot-v1", algo="DQN").spec.algorithm.target_network_update_freq == 250
    bare = LearnerSettings(env="MountainCar-v0", algo="DQN").spec  # no DQN preset: DQN's defaults, not PPO's preset
    assert bare.algorithm.name == "DQN" and bare.algorithm.train_batch_size == 32 and not bare.connectors.learner
    assert LearnerSettings(env="Pendulum-v1", algo="SAC", preset="MountainCarContinuous-v0").spec.algorithm.tau == 0.01


def test_every_ale_game_starts_from_the_atari_preset() -> None:
    """`--env ALE/Breakout-v5` takes the ALE preset (RLlib's Atari recipe) with its own id; `--preset ALE` alone
    is Pong."""
    breakout = UpSettings(env="ALE/Breakout-v5").spec
    assert breakout.env.id == "ALE/Breakout-v5" and breakout.env.wrappers[0].type == "AtariPreprocessing"
    assert breakout.connectors.env_to_module[0].kwargs == {"num_frames": 4}
    assert UpSettings(preset="ALE").spec.env.id == "ALE/Pong-v5"
    assert UpSettings(env="ALEX/Pong-v5").spec.env.wrappers == []  # a namespace of its own: no preset


def test_a_flag_replaces_a_presets_schedule_with_one_number() -> None:
    assert isinstance(UpSettings().spec.algorithm.lr, list)
    assert UpSettings(_cli_parse_args=["--spec.algorithm.lr", "3e-4"]).spec.algorithm.lr == 3e-4


def test_schedules_are_linear_between_their_points_and_constant_after() -> None:
    config = PPOConfig(lr=[[0, 1e-3], [1000, 0.0]], clip_param=0.2)
    assert scheduled(config.lr, 0) == 1e-3 and scheduled(config.lr, 500) == pytest.approx(5e-4)
    assert scheduled(config.lr, 5000) == 0.0 and scheduled(config.clip_param, 10**9) == 0.2
    with pytest.raises(ValueError, match="must increase"):
        PPOConfig(lr=[[10, 1e-3], [0, 0.0]])


def test_one_updates_config_holds_each_schedules_value_then() -> None:
    """`at(env_steps)`: what an update trains with; RLlib's entropy_coeff takes a schedule too, and may reach 0."""
    config = PPOConfig(lr=[[0, 1e-3], [1000, 0.0]], entropy_coeff=[[0, 0.01], [1000, 0.0]], num_epochs=3)
    now = config.at(250)
    assert (now.lr, now.clip_param, now.num_epochs) == (pytest.approx(7.5e-4), 0.2, 3)
    assert now.entropy_coeff == pytest.approx(0.0075) and config.at(2000).entropy_coeff == 0.0
    assert isinstance(config.entropy_coeff, list)  # the spec's own schedule stays
    assert UpSettings(_cli_parse_args=["--spec.algorithm.entropy-coeff", "0.02"]).spec.algorithm.entropy_coeff == 0.02
    for bad in (-0.01, [[0, 0.01], [10, -0.01]]):
        with pytest.raises(ValueError, match="negative"):
            PPOConfig(entropy_coeff=bad)


@pytest.mark.parametrize(("algorithm", "name"), [(a, name) for a in ("PPO", "DQN", "SAC") for name in preset_names(a)])
def test_no_preset_schedule_reaches_0_so_a_learner_that_never_stops_keeps_learning(algorithm: str, name: str) -> None:
    """A schedule that ends at 0 freezes the policy for good, whatever it is then: a service runs on for days.
    Until it flattens out, CartPole's is rl-zoo's (lin_0.001 and lin_0.2 over 100k env steps) value for value.
    (A fixed 0 is a choice, not a schedule: SAC's alpha_lr 0 holds alpha.)"""
    config = RunSpec.parse(preset(name, algorithm), name).algorithm
    for field in config.SCHEDULED:
        schedule = getattr(config, field)
        assert not isinstance(schedule, list) or schedule[-1][1] > 0, (name, field)
    for step in (0, 10**5, 10**9):
        now = config.at(step)
        rates = [getattr(now, f) for f in ("lr", "clip_param", "actor_lr", "critic_lr") if hasattr(now, f)]
        assert rates and all(rate > 0 for rate in rates), (name, step)
    if (algorithm, name) == ("PPO", "CartPole-v1"):
        for step in (0, 25_000, 50_000, 90_000):
            assert config.at(step).lr == pytest.approx(1e-3 * (1 - step / 1e5))
            assert config.at(step).clip_param == pytest.approx(0.2 * (1 - step / 1e5))
