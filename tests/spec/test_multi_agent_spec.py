"""The run spec's multi-agent section: mappings, module spaces, what trains; single-agent specs are unchanged."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlgate.episodes import MultiAgentEpisode
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import (
    agent_to_module_mapping_fn,
    build_multi_agent_env_to_module,
    build_multi_rl_module,
    module_spaces,
)
from rlgate.spec.run import RunSpec

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
AGENTS = {"left": (BOX, ACT), "right": (BOX, ACT)}


def spec(**multi_agent) -> RunSpec:
    return RunSpec.parse({"multi_agent": multi_agent}, "test")


def test_a_spec_without_the_section_is_single_agent() -> None:
    assert RunSpec().multi_agent is None
    assert RunSpec.parse({"env": {"id": "CartPole-v1"}}, "test").multi_agent is None


@pytest.mark.parametrize(
    ("mapping", "modules"),
    [("shared", ["default_policy"]), ("per_agent", ["left", "right"])],
)
def test_builtin_mappings(mapping: str, modules: list[str]) -> None:
    found = module_spaces(spec(policy_mapping_fn=mapping), AGENTS, ImportPolicy())
    assert list(found) == modules
    assert all(spaces == (BOX, ACT) for spaces in found.values())


def test_user_mapping_by_import_path_needs_its_modules_and_permission() -> None:
    path = "tests_support_mapping:by_side"
    with pytest.raises(SpecError, match="policies"):
        spec(policy_mapping_fn=path)
    with pytest.raises(SpecError, match="may not import"):
        module_spaces(spec(policy_mapping_fn=path, policies=["l", "r"]), AGENTS, ImportPolicy())


def test_agents_of_one_module_need_the_same_spaces() -> None:
    agents = {"left": (BOX, ACT), "right": (gym.spaces.Box(0.0, 1.0, (2,), np.float32), ACT)}
    with pytest.raises(SpecError, match="'left' and 'right' map to module 'default_policy'"):
        module_spaces(spec(policy_mapping_fn="shared"), agents, ImportPolicy())


MAPPINGS = """
def by_game(agent_id, episode):
    if not episode.agent_ids:
        raise AssertionError("mapped outside a game")
    return "main"


def by_side(agent_id, episode):
    return {"left": "l", "right": "r"}[agent_id]
"""


@pytest.fixture
def mappings(tmp_path, monkeypatch) -> ImportPolicy:
    """An importable module of mapping functions (`ttt_mappings`), and the permission to import it."""
    (tmp_path / "ttt_mappings.py").write_text(MAPPINGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ImportPolicy(["ttt_mappings"])


def test_agents_alike_give_every_declared_module_their_spaces_without_mapping_them(mappings) -> None:
    """RLlib's get_multi_agent_setup: when all agents have the same spaces, every policy gets them. The mapping
    is not called outside an episode, so it may depend on the episode (a frozen opponent drawn per game)."""
    run = spec(policy_mapping_fn="ttt_mappings:by_game", policies=["main", "random"], policies_to_train=["main"])
    assert module_spaces(run, AGENTS, mappings) == {"main": (BOX, ACT), "random": (BOX, ACT)}


def test_agents_unlike_are_mapped_to_find_their_modules_spaces(mappings) -> None:
    small = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    agents = {"left": (BOX, ACT), "right": (small, ACT)}
    run = spec(policy_mapping_fn="ttt_mappings:by_side", policies=["r", "l"])
    assert module_spaces(run, agents, mappings) == {"r": (small, ACT), "l": (BOX, ACT)}
    run = spec(policy_mapping_fn="ttt_mappings:by_side", policies=["l", "r", "spare"])
    with pytest.raises(SpecError, match=r"no agent of the env maps to modules \['spare'\]"):
        module_spaces(run, agents, mappings)


def test_a_mapping_is_held_to_its_policies(mappings) -> None:
    """Built-in mappings are checked at start-up; a function of the user's on every call (it may depend on the
    episode), with an error naming the agent and the module."""
    with pytest.raises(SpecError, match="agent 'left' maps to module 'left', not in policies"):
        module_spaces(spec(policy_mapping_fn="per_agent", policies=["a", "b"]), AGENTS, mappings)
    run = spec(policy_mapping_fn="ttt_mappings:by_side", policies=["l", "x"])
    assert list(module_spaces(run, AGENTS, mappings)) == ["l", "x"]  # agents alike: not mapped at start-up
    mapping = agent_to_module_mapping_fn(run, mappings)
    assert mapping("left", MultiAgentEpisode()) == "l"
    with pytest.raises(SpecError, match="mapped agent 'right' to module 'r', not in policies"):
        mapping("right", MultiAgentEpisode())


def test_policies_to_train_must_be_modules() -> None:
    with pytest.raises(SpecError, match="policies_to_train"):
        spec(policy_mapping_fn="per_agent", policies=["left", "right"], policies_to_train=["up"])


def test_dict_observations_are_flattened_for_the_default_model() -> None:
    """PettingZoo's classic games observe a Dict (observation, action_mask): the default model gets it flat."""
    board = gym.spaces.Dict(
        {"action_mask": gym.spaces.Box(0, 1, (9,), np.int8), "observation": gym.spaces.Box(0, 1, (3, 3, 2), np.int8)}
    )
    run = spec(policy_mapping_fn="shared")
    pipeline = build_multi_agent_env_to_module(run, {"p1": (board, ACT), "p2": (board, ACT)}, ImportPolicy())
    assert pipeline.observation_space == gym.spaces.Dict(
        {"default_policy": gym.spaces.Box(-np.inf, np.inf, (27,), np.float32)}
    )
    modules = {m: (pipeline.observation_space[m], ACT) for m in pipeline.observation_space.spaces}
    assert list(build_multi_rl_module(run, modules, ImportPolicy()).keys()) == ["default_policy"]
