"""Multi-agent step messages: `AgentsStep`s decoded and checked per sub-env, `AgentActions` encoded.

An `AgentsStepDecoder` is built once at hello, with each declared agent's observation space prepared as a
`SpaceCheck` (one unbatched value per agent), so agents' observations follow the same rules as single-agent
ones (core.space_check). Every rejection names the sub-env and the agent and is a CodecError (the client
gets INVALID_ARGUMENT); NaN and infinities are `NonFiniteError`s, counted by field ("obs", "reward").
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym

from rlgate.core import codec
from rlgate.core.agents_step import ALL, AgentsStep
from rlgate.core.codec import CodecError
from rlgate.core.space_check import NonFiniteError, SpaceCheck, finite_as_float32
from rlgate.server.step_decoder import check_infos_size
from rlgate.v1 import policy_pb2 as pb


class AgentsStepDecoder:
    """Decodes a multi-agent session's `Step` messages: one AgentsStep per sub-env."""

    def __init__(
        self, observation_spaces: dict[str, gym.Space], num_envs: int, *, allow_non_finite_obs: bool = False
    ) -> None:
        self.num_envs = num_envs
        self._obs = {
            agent: SpaceCheck(space, path=f"obs[{agent!r}]", allow_infinite=allow_non_finite_obs)
            for agent, space in observation_spaces.items()
        }

    def decode(self, step: pb.Step) -> list[AgentsStep]:
        """The N sub-envs' steps, checked against the agents the hello declared."""
        if len(step.agents) != self.num_envs:
            raise CodecError(f"agents: {len(step.agents)} sub-env steps != num_envs {self.num_envs}")
        check_infos_size((info for message in step.agents for info in message.infos.values()), "agents[*].infos")
        return [self._decode(message, f"agents[{i}]") for i, message in enumerate(step.agents)]

    def _decode(self, message: pb.AgentsStep, path: str) -> AgentsStep:
        agents = self._obs
        for field in ("obs", "rewards", "terminateds", "truncateds", "infos"):
            known = (*agents, ALL) if field in ("terminateds", "truncateds") else agents
            for agent_id in getattr(message, field):
                if agent_id not in known:
                    raise CodecError(
                        f"{path}.{field}: unknown agent {agent_id!r} (the hello declared {', '.join(sorted(agents))})"
                    )
        for field in ("terminateds", "truncateds"):
            if ALL not in getattr(message, field):
                raise CodecError(f"{path}.{field}: no {ALL!r}: say whether the episode is over for all agents")
        observations = {}
        for agent_id, value in message.obs.items():
            try:
                observations[agent_id] = agents[agent_id].decode(value, None)
            except CodecError as exc:
                raise _in(path, exc, "obs") from None
        rewards = dict(message.rewards)
        for agent_id, reward in rewards.items():
            if not finite_as_float32(reward):  # as a single-agent step's rewards: checked as the float32 stored
                what = "NaN" if math.isnan(reward) else f"value {reward:g} is not finite as float32"
                raise _in(path, NonFiniteError(f"rewards[{agent_id!r}]: {what}"), "reward")
        return AgentsStep(
            observations=observations,
            rewards=rewards,
            terminateds=dict(message.terminateds),
            truncateds=dict(message.truncateds),
            infos={agent_id: codec.from_struct(info) for agent_id, info in message.infos.items()},
        )


def _in(path: str, exc: CodecError, field: str) -> CodecError:
    """`exc` with the sub-env's path in front; a NonFiniteError keeps its kind, counted under `field`."""
    if isinstance(exc, NonFiniteError):
        return NonFiniteError(f"{path}.{exc}", field)
    return type(exc)(f"{path}.{exc}")


def encode_agent_actions(actions: list[dict[str, Any]]) -> list[pb.AgentActions]:
    """One AgentActions per sub-env: the actions for its acting agents."""
    return [
        pb.AgentActions(actions={agent_id: codec.to_value(action) for agent_id, action in per_env.items()})
        for per_env in actions
    ]
