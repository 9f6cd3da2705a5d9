"""AgentEnvs: a PettingZoo ParallelEnv's steps as the wire's multi-agent steps, "__all__" flags included."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo import ParallelEnv

from rlgate.client.agent_envs import AgentEnvs
from rlgate.core.agents_step import ALL


class LeaveTogether(ParallelEnv):
    """Agents a and b both leave at step 2, with the flags given: (a terminated, a truncated, b ..., b ...)."""

    metadata = {"name": "leave_together_v0"}

    def __init__(self, flags: tuple[bool, bool, bool, bool]) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.flags, self.t = flags, 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        end = self.t == 2
        a_term, a_trunc, b_term, b_trunc = self.flags if end else (False,) * 4
        agents, self.agents = self.agents, [] if end else self.agents
        return (
            {a: np.zeros(1, np.float32) for a in agents},
            {a: 1.0 for a in agents},
            {"a": a_term, "b": b_term},
            {"a": a_trunc, "b": b_trunc},
            {a: {} for a in agents},
        )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((True, False, True, False), (True, False)),  # every agent terminated
        ((False, True, False, True), (False, True)),  # every agent truncated (time limit)
        ((True, False, False, True), (False, False)),  # a pole falls as the other's time runs out: each its own
        ((False, False, False, False), (False, True)),  # gone with no flag of their own: truncated
    ],
    ids=["terminated", "truncated", "mixed", "unflagged"],
)
def test_the_all_flags_let_each_agent_keep_its_own_where_they_leave_differently(flags, expected):
    """proto/README.md: '__all__' true only where it holds for every agent leaving; where agents leave differently,
    false in both maps, so a truncated agent is not marked terminated too (its value is bootstrapped). Either
    way the sub-env is over: its next step is a reset."""
    envs = AgentEnvs([LeaveTogether(flags)])
    envs.reset(seed=0)
    envs.step([{"a": 0, "b": 0}])
    (last,) = envs.step([{"a": 0, "b": 0}])
    assert (last.terminateds[ALL], last.truncateds[ALL]) == expected
    (reset,) = envs.step([{}])
    assert set(reset.observations) == {"a", "b"} and reset.rewards == {}
