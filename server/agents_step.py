"""Multi-agent step messages: `AgentsStep`s decoded and validated per sub-env, `AgentActions` encoded.

Every check names the sub-env and the agent, and raises CodecError (the client gets INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym

from rlgate.core import codec
from rlgate.core.agents_step import ALL, AgentsStep
from rlgate.core.codec import CodecError
from rlgate.v1 import policy_pb2 as pb


def decode_agents_steps(messages: Any, observation_spaces: dict[str, gym.Space], num_envs: int) -> list[AgentsStep]:
    """The N sub-envs' steps of a Step message, checked against the agents a hello declared."""
    if len(messages) != num_envs:
        raise CodecError(f"agents: {len(messages)} sub-env steps != num_envs {num_envs}")
    return [_decode(message, observation_spaces, f"agents[{i}]") for i, message in enumerate(messages)]


def _decode(message: pb.AgentsStep, spaces: dict[str, gym.Space], path: str) -> AgentsStep:
    for field in ("obs", "rewards", "terminateds", "truncateds", "infos"):
        known = (*spaces, ALL) if field in ("terminateds", "truncateds") else spaces
        for agent_id in getattr(message, field):
            if agent_id not in known:
                raise CodecError(
                    f"{path}.{field}: unknown agent {agent_id!r} (the hello declared {', '.join(sorted(spaces))})"
                )
    for field in ("terminateds", "truncateds"):
        if ALL not in getattr(message, field):
            raise CodecError(f"{path}.{field}: no {ALL!r}: say whether the episode is over for all agents")
    observations = {}
    for agent_id, value in message.obs.items():
        observation = codec.from_value(value, f"{path}.obs[{agent_id!r}]")
        codec.validate(observation, spaces[agent_id], path=f"{path}.obs[{agent_id!r}]")
        observations[agent_id] = observation
    rewards = dict(message.rewards)
    for agent_id, reward in rewards.items():
        if not math.isfinite(reward):
            raise CodecError(f"{path}.rewards[{agent_id!r}]: {reward} is not a finite number")
    return AgentsStep(
        observations=observations,
        rewards=rewards,
        terminateds=dict(message.terminateds),
        truncateds=dict(message.truncateds),
        infos={agent_id: codec.from_struct(info) for agent_id, info in message.infos.items()},
    )


def encode_agent_actions(actions: list[dict[str, Any]]) -> list[pb.AgentActions]:
    """One AgentActions per sub-env: the actions for its acting agents."""
    return [
        pb.AgentActions(actions={agent_id: codec.to_value(action) for agent_id, action in per_env.items()})
        for per_env in actions
    ]
