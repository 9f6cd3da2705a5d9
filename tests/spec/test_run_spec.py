"""The run spec: files and flags, validation messages, imports only where allowed, pipelines and modules built."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import gymnasium as gym
import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter
from rlgate.learner.settings import LearnerSettings
from rlgate.models import ModelConfig
from rlgate.spec.build import build_env_to_module, build_learner_connector, build_module_to_env, build_rl_module
from rlgate.spec.env import agent_spaces, env_spaces, make_env
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import (
    build_multi_agent_env_to_module,
    build_multi_agent_learner_connector,
    build_multi_rl_module,
)
from rlgate.spec.run import EnvSpec, RunSpec, unknown_keys

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CARTPOLE = gym.make("CartPole-v1")

TOML = """
[env]
id = "CartPole-v1"
num_envs = 3

[model.config]
fcnet_hiddens = [16]

[connectors]
env_to_module = ["MeanStdFilter", { type = "FrameStackingEnvToModule", num_frames = 2 }]
learner = [{ type = "FrameStackingLearner", num_frames = 2 }]

[sampling]
rollout_fragment_length = 50

[algorithm]
lr = 0.0003
"""


def test_toml_yaml_and_json_files_read_into_the_same_spec(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(TOML)
    spec = RunSpec.load(tmp_path / "run.toml")
    assert spec.env.num_envs == 3 and spec.algorithm.lr == 3e-4 and spec.sampling.rollout_fragment_length == 50
    assert [p.type for p in spec.connectors.env_to_module] == ["MeanStdFilter", "FrameStackingEnvToModule"]
    assert spec.connectors.env_to_module[1].kwargs == {"num_frames": 2}
    (tmp_path / "run.json").write_text(spec.to_json())
    assert RunSpec.load(tmp_path / "run.json") == spec
    yaml = "env: {id: CartPole-v1, num_envs: 3}\nalgorithm: {lr: 0.0003}\n"
    (tmp_path / "run.yaml").write_text(yaml)
    assert RunSpec.load(tmp_path / "run.yaml").algorithm.lr == 3e-4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[algorithm]\nlr = -1\n", "algorithm.lr: Value error, must be greater than 0"),
        ("[algorithm]\nlearning_rate = 0.1\n", "[algorithm] learning_rate: unknown key (it takes: "),
        ("[algorithm]\nname = 'A3C'\n", "algorithm.name: no algorithm 'A3C': the algorithms are PPO, DQN, SAC"),
        ("[algorithm]\nname = 'SAC'\nclip_param = 0.1\n", "algorithm.clip_param: not a field of SAC (it is PPO's)"),
        ("[algorithm]\nname = 'PPO'\nepsilon = 0.1\n", "algorithm.epsilon: not a field of PPO (it is DQN's)"),
        ("[algorithm]\nname = 'DQN'\nn_step = [3, 2]\n", "algorithm.n_step: Value error, must be at least 1"),
        ("[algorithm]\nname = 'DQN'\nreplay_buffer_config = { type = 'Reservoir' }\n", "replay_buffer_config.type"),
        ("[model.config]\nfcnet_hidens = [8]\n", "model.config"),
        ("[sampling]\nbatch_mode = 'whole'\n", "sampling.batch_mode"),
        ("[env\nid = 1\n", "not valid TOML"),
    ],
)
def test_a_bad_file_names_itself_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"bad\.toml") as raised:
        RunSpec.load(path)
    assert message in str(raised.value)


def test_a_typo_in_a_file_names_the_file_the_section_and_the_keys_it_may_mean(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text("seeed = 1\n[env]\nnum_env = 4\n[algoritm]\nlr = 0.1\n[model.config]\nlstm_cel_size = 8\n")
    with pytest.raises(SpecError) as raised:
        RunSpec.load(path)
    assert str(raised.value) == (
        f"{path}: seeed: unknown key (did you mean seed?); [env] num_env: unknown key (did you mean num_envs?); "
        "[algoritm]: unknown section (did you mean [algorithm]?); "
        "[model.config] lstm_cel_size: unknown key (did you mean lstm_cell_size?)"
    )
    # The same keys where anything goes: a piece's or the env's kwargs, a user's module's config.
    path.write_text(
        "[env]\nkwargs = { num_env = 4 }\n[connectors]\nenv_to_module = [{ type = 'MeanStdFilter', num_env = 1 }]\n"
        "[model]\nmodule_class = 'examples.tiny_module:TinyModule'\nconfig = { lstm_cel_size = 8 }\n"
    )
    assert RunSpec.load(path).env.kwargs == {"num_env": 4}


class _Left(BaseModel):
    model_config = ConfigDict(extra="forbid")
    side: Literal["left"] = "left"
    reach: int = 1


class _Right(BaseModel):
    model_config = ConfigDict(extra="forbid")
    side: Literal["right"] = "right"
    grip: int = 1


class _Tagged(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arm: Annotated[_Left | _Right, Field(discriminator="side")] = Field(default_factory=_Left)


def test_a_tagged_sections_keys_are_its_tagged_members(tmp_path: Path) -> None:
    """A section that is one of several models by a tag (the algorithm by its name) takes that model's keys."""
    assert unknown_keys({"arm": {"side": "right", "grip": 2, "gripp": 3}}, _Tagged) == [
        "[arm] gripp: unknown key (did you mean grip?)"
    ]
    assert unknown_keys({"arm": {"reac": 2}}, _Tagged) == ["[arm] reac: unknown key (did you mean reach?)"]
    assert unknown_keys({"arm": {"side": "right", "reach": 2}}, _Tagged) == [
        "[arm] reach: unknown key (it takes: side, grip)"
    ]


def test_flags_and_variables_override_single_fields_of_the_file(tmp_path: Path, monkeypatch) -> None:
    assert not LearnerSettings(_cli_parse_args=[]).spec_given()
    (tmp_path / "run.toml").write_text(TOML)
    monkeypatch.setenv("RLGATE_SPEC__SAMPLING__ROLLOUT_FRAGMENT_LENGTH", "7")
    argv = ["--config", str(tmp_path / "run.toml"), "--spec.algorithm.lr", "0.01", "--env", "Acrobot-v1", "--seed", "5"]
    settings = LearnerSettings(_cli_parse_args=argv)
    spec = settings.spec
    assert spec.algorithm.lr == 0.01  # the flag
    assert spec.sampling.rollout_fragment_length == 7  # the variable
    assert spec.env.id == "Acrobot-v1" and spec.env.num_envs == 3 and spec.seed == 5  # shorthands over the file
    assert spec.connectors.learner[0].kwargs == {"num_frames": 2}  # the rest of the file
    assert settings.spec_given()


def test_gae_lambda_is_lambda_or_rllibs_lambda_in_flags_and_files(tmp_path: Path) -> None:
    """`lambda` is Python's keyword, so RLlib names the field `lambda_`; a user may type either."""
    for flag in ("--spec.algorithm.lambda", "--spec.algorithm.lambda-"):
        assert LearnerSettings(_cli_parse_args=[flag, "0.9"]).spec.algorithm.lambda_ == 0.9
    for key in ("lambda", "lambda_"):
        (tmp_path / "run.toml").write_text(f"[algorithm]\n{key} = 0.7\n")
        spec = RunSpec.load(tmp_path / "run.toml")
        assert spec.algorithm.lambda_ == 0.7
        assert RunSpec.parse(spec.model_dump(mode="json"), "its dump").algorithm.lambda_ == 0.7  # RLlib's name out


def test_code_is_imported_only_from_allowed_modules(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "pieces.py").write_text(
        "from rlgate.connectors import ConnectorV2\n"
        "class Noop(ConnectorV2):\n"
        "    def __call__(self, *, batch, **kwargs):\n"
        "        return batch\n"
        "NOT_A_PIECE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "userpkg.pieces", raising=False)
    spec = RunSpec.parse({"connectors": {"env_to_module": [{"type": "userpkg.pieces:Noop"}]}}, "test")
    assert spec.modules() == ["userpkg.pieces"]
    with pytest.raises(SpecError, match=r"may not import.*--allow-import userpkg"):
        build_env_to_module(spec, CARTPOLE.observation_space, CARTPOLE.action_space, ImportPolicy())
    assert "userpkg.pieces" not in sys.modules  # refused before importing anything
    pipeline = build_env_to_module(spec, CARTPOLE.observation_space, CARTPOLE.action_space, ImportPolicy(["userpkg"]))
    assert pipeline[0].name == "Noop"
    assert not ImportPolicy(["user"]).allows("userpkg.pieces")  # a prefix of a name is not its package
    bad = RunSpec.parse({"connectors": {"env_to_module": [{"type": "userpkg.pieces:NOT_A_PIECE"}]}}, "test")
    with pytest.raises(SpecError, match="not a ConnectorV2 subclass"):
        build_env_to_module(bad, CARTPOLE.observation_space, CARTPOLE.action_space, ImportPolicy(["userpkg"]))


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("pettingzoo.classic.tictactoe_v3:env", "pettingzoo"),
        ("examples.multi_agent_cartpole:MultiAgentCartPole", "examples"),
    ],
)
def test_code_that_needs_pettingzoo_without_it_says_which_extra_installs_it(path, allowed, monkeypatch) -> None:
    """PettingZoo is an extra: a spec that needs it where it is not installed says how to install it."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("pettingzoo", "examples")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)  # importing it fails, as where it is not installed
    monkeypatch.syspath_prepend(str(EXAMPLES.parent))
    with pytest.raises(SpecError) as raised:
        ImportPolicy([allowed]).load(path, "env.id")
    assert str(raised.value).startswith(
        f"env.id: {path.split(':')[0]} needs pettingzoo: pip install 'rlgate[pettingzoo]'"
    )


@pytest.mark.parametrize(
    ("piece", "message"),
    [
        ({"type": "FrameStackng"}, "no built-in connector piece 'FrameStackng'"),
        ({"type": "FrameStackingEnvToModule", "frames": 4}, "takes no argument frames (it takes: "),
    ],
)
def test_a_bad_piece_is_refused_with_its_place_and_the_reason(piece: dict, message: str) -> None:
    spec = RunSpec.parse({"connectors": {"env_to_module": ["MeanStdFilter", piece]}}, "test")
    with pytest.raises(SpecError, match=r"connectors\.env_to_module\[1\]") as raised:
        build_env_to_module(spec, CARTPOLE.observation_space, CARTPOLE.action_space, ImportPolicy())
    assert message in str(raised.value)


def test_an_import_path_that_is_not_one_fails_when_the_spec_is_read() -> None:
    with pytest.raises(SpecError, match=r"connectors.env_to_module.0.type.*is not an import path"):
        RunSpec.parse({"connectors": {"env_to_module": [{"type": "not a path:X"}]}}, "test")


def test_user_pieces_come_first_and_flattening_follows_them_when_the_model_needs_it() -> None:
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "mode": gym.spaces.Discrete(3)})
    spec = RunSpec.parse({"connectors": {"env_to_module": ["MeanStdFilter"]}}, "test")
    pipeline = build_env_to_module(spec, space, gym.spaces.Discrete(2), ImportPolicy())
    assert isinstance(pipeline[0], MeanStdFilter) and isinstance(pipeline[1], FlattenObservations)
    assert pipeline.observation_space == gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    plain = build_env_to_module(spec, CARTPOLE.observation_space, CARTPOLE.action_space, ImportPolicy())
    assert not any(isinstance(piece, FlattenObservations) for piece in plain.connectors)
    learner = build_learner_connector(RunSpec.parse(tomllib.loads(TOML), "test"), *CARTPOLE_SPACES, ImportPolicy())
    assert [p.name for p in learner.connectors][:2] == ["AddOneTsToEpisodesAndTruncate", "FrameStacking"]
    assert learner.connectors[-1].name == "GeneralAdvantageEstimation"
    assert build_module_to_env(spec, *CARTPOLE_SPACES, ImportPolicy())[-1].name == "ListifyDataForVectorEnv"


CARTPOLE_SPACES = (CARTPOLE.observation_space, CARTPOLE.action_space)


def test_the_module_follows_the_model_section_and_the_seed(examples_importable) -> None:
    spec = RunSpec.parse({"model": {"config": {"fcnet_hiddens": [16]}}, "seed": 1}, "test")
    first, second = (build_rl_module(spec, *CARTPOLE_SPACES, ImportPolicy()) for _ in range(2))
    assert first.model_config == ModelConfig(fcnet_hiddens=(16,))
    assert all((a == b).all() for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True))
    custom = RunSpec.parse(
        {"model": {"module_class": "examples.tiny_module:TinyActorCritic", "config": {"hidden": 8}}}, "test"
    )
    with pytest.raises(SpecError, match=r"names code in 'examples\.tiny_module', which this process may not import"):
        build_rl_module(custom, *CARTPOLE_SPACES, ImportPolicy())
    module = build_rl_module(custom, *CARTPOLE_SPACES, ImportPolicy(["examples"]))
    assert module.model_config == {"hidden": 8} and module.body[0].out_features == 8


def test_envs_by_registered_id_class_factory_or_registering_module(examples_importable) -> None:
    imports = ImportPolicy(["examples"])
    corridor = EnvSpec(id="examples.corridor:Corridor", kwargs={"length": 5})
    assert env_spaces(corridor, imports)[0] == gym.spaces.Discrete(5)
    stateless = EnvSpec(id="examples.stateless_cartpole:StatelessCartPole-v1", num_envs=3)
    vector = make_env(stateless, imports)
    assert vector.num_envs == 3 and vector.single_observation_space.shape == (2,)
    vector.close()
    assert env_spaces(EnvSpec(id="CartPole-v1", kwargs={"max_episode_steps": 7}), imports) == CARTPOLE_SPACES
    with pytest.raises(SpecError, match=r"env\.id"):
        env_spaces(EnvSpec(id="NoSuchEnv-v9"), imports)
    with pytest.raises(SpecError, match="may not import"):
        env_spaces(corridor, ImportPolicy())


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.glob("*.toml")) + sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_spec_builds_its_policy(path: Path, examples_importable) -> None:
    spec = RunSpec.load(path)
    imports = ImportPolicy(spec.modules())
    if spec.multi_agent:
        pytest.importorskip("pettingzoo")
        pipeline = build_multi_agent_env_to_module(spec, agent_spaces(spec.env, imports), imports)
        modules = {m: (pipeline.observation_space[m], pipeline.action_space[m]) for m in pipeline.observation_space}
        build_multi_rl_module(spec, modules, imports)
        build_multi_agent_learner_connector(spec, modules, imports)
        return
    observation_space, action_space = env_spaces(spec.env, imports)
    pipeline = build_env_to_module(spec, observation_space, action_space, imports)
    module = build_rl_module(spec, pipeline.observation_space, action_space, imports)
    build_learner_connector(spec, module.observation_space, module.action_space, imports)


def test_the_algorithm_chooses_the_default_module_and_its_learner_pieces() -> None:
    from rlgate.connectors.learner import AddNextObservationsFromEpisodesToTrainBatch, GeneralAdvantageEstimation
    from rlgate.models import ActorCriticModule, DQNModule, SACModule

    obs, actions = CARTPOLE.observation_space, CARTPOLE.action_space
    box = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    cases = {"PPO": (actions, ActorCriticModule), "DQN": (actions, DQNModule), "SAC": (box, SACModule)}
    for name, (space, cls) in cases.items():
        spec = RunSpec.parse({"algorithm": {"name": name}, "seed": 0}, name)
        module = build_rl_module(spec, obs, space, ImportPolicy())
        assert type(module) is cls
        pieces = [type(p) for p in build_learner_connector(spec, obs, space, ImportPolicy()).connectors]
        assert (GeneralAdvantageEstimation in pieces) == (name == "PPO")
        assert (AddNextObservationsFromEpisodesToTrainBatch in pieces) == (name != "PPO")
    dqn = RunSpec.parse({"algorithm": {"name": "DQN", "epsilon": [[0, 0.7], [100, 0.1]], "dueling": False}}, "x")
    module = build_rl_module(dqn, obs, actions, ImportPolicy())
    assert float(module.epsilon) == pytest.approx(0.7) and module.vf is None  # the schedule's start, no dueling
    with pytest.raises(SpecError, match=r"^algorithm.name: DQN takes Discrete actions"):
        build_rl_module(dqn, obs, box, ImportPolicy())
    lstm = RunSpec.parse({"algorithm": {"name": "SAC"}, "model": {"config": {"use_lstm": True}}}, "x")
    with pytest.raises(SpecError, match=r"^model.config.use_lstm: SAC takes stateless modules"):
        build_rl_module(lstm, obs, box, ImportPolicy())
    assert RunSpec.parse({"algorithm": {"lr": 1e-4}}, "old").algorithm.name == "PPO"  # specs from before: PPO
    actor_critic = {
        "algorithm": {"name": "DQN"},
        "model": {"module_class": "support.rllib_style_module:RLlibStyleModule"},
    }
    with pytest.raises(SpecError, match=r"^model.module_class: DQN trains a subclass of rlgate.models.DQNModule"):
        build_rl_module(RunSpec.parse(actor_critic, "x"), obs, actions, ImportPolicy(["support"]))
