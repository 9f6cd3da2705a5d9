"""A multi-agent env step, keyed by agent id: what a PettingZoo ParallelEnv (or RLlib's MultiAgentEnv) returns.

The env clients build them from PettingZoo envs; the server decodes them from the wire and feeds them to
MultiAgentEpisode.add_env_step. ALL ("__all__") is the key of the done flags that end the episode for everyone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL = "__all__"


@dataclass
class AgentsStep:
    """One sub-env's step: observations of the agents that act next, rewards, done flags (with ALL), infos."""

    observations: dict[str, Any]
    rewards: dict[str, float] = field(default_factory=dict)
    terminateds: dict[str, bool] = field(default_factory=lambda: {ALL: False})
    truncateds: dict[str, bool] = field(default_factory=lambda: {ALL: False})
    infos: dict[str, dict] = field(default_factory=dict)


def is_aec(env: Any) -> bool:
    """A PettingZoo AECEnv (agent_selection, last()) rather than a ParallelEnv."""
    return hasattr(env, "agent_iter") and hasattr(env, "last")  # (agent_selection exists only after reset)
