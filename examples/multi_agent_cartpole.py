"""Independent CartPoles as the agents of one PettingZoo ParallelEnv (RLlib's MultiAgentCartPole example).

Each agent balances its own pole; an agent whose pole falls (or that reaches CartPole's 500-step limit) leaves
the env, and the episode ends when every agent has left. Needs the [pettingzoo] extra.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from pettingzoo import ParallelEnv


class MultiAgentCartPole(ParallelEnv):
    """`num_agents` CartPole-v1 envs, agents "agent_0", "agent_1", ..."""

    metadata = {"name": "multi_agent_cartpole_v0"}

    def __init__(self, num_agents: int = 2) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self._envs = {agent: gym.make("CartPole-v1") for agent in self.possible_agents}

    def observation_space(self, agent: str) -> gym.Space:
        return self._envs[agent].observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self._envs[agent].action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        observations, infos = {}, {}
        for i, agent in enumerate(self.agents):
            observations[agent], infos[agent] = self._envs[agent].reset(seed=None if seed is None else seed + i)
        return observations, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        for agent in self.agents:
            step = self._envs[agent].step(actions[agent])
            observations[agent], rewards[agent], terminateds[agent], truncateds[agent], infos[agent] = step
        self.agents = [a for a in self.agents if not (terminateds[a] or truncateds[a])]
        return observations, rewards, terminateds, truncateds, infos

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
