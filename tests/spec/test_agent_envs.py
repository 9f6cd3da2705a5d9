"""AgentEnvs: a PettingZoo ParallelEnv's steps as the wire's multi-agent steps, "__all__" flags included."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pettingzoo")
from support.bad_agent_envs import ParallelSteps

from rlgate.core.agents_step import ALL
from rlgate.envs.agent_envs import AgentEnvs


class LeaveTogether(ParallelSteps):
    """Agents a0 and a1 both leave at step 2, with the flags given: (a0 terminated, a0 truncated, a1 ..., a1 ...)."""

    def __init__(self, flags: tuple[bool, bool, bool, bool]) -> None:
        super().__init__()
        self.flags = flags

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, _, _, infos = super().step(actions)
        end = self.t == 2
        self.agents = [] if end else self.agents
        a0_term, a0_trunc, a1_term, a1_trunc = self.flags if end else (False,) * 4
        return observations, rewards, {"a0": a0_term, "a1": a1_term}, {"a0": a0_trunc, "a1": a1_trunc}, infos


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
    envs.step([{"a0": 0, "a1": 0}])
    (last,) = envs.step([{"a0": 0, "a1": 0}])
    assert (last.terminateds[ALL], last.truncateds[ALL]) == expected
    assert envs.done == [True]  # what EnvClient counts an ended episode by, whatever the flags
    (reset,) = envs.step([{}])
    assert set(reset.observations) == {"a0", "a1"} and reset.rewards == {}
