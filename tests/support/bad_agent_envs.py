"""PettingZoo envs that break PettingZoo's contract the ways users' envs do, for the errors `rlgate env` must name
(the multi-agent side of bad_envs.py). Importable on their own, as a subprocess imports them; need pettingzoo."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.agent_selector import AgentSelector

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
AGENTS = ["a0", "a1"]


class ParallelSteps(ParallelEnv):
    """Two agents of Box(4) observations and 2 actions, episodes of 10 steps; step() raises at step `fail_at`."""

    metadata = {"name": "parallel_steps_v0"}

    def __init__(self, fail_at: int = 0) -> None:
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.fail_at, self.t = fail_at, 0

    def observation_space(self, agent: str) -> gym.Space:
        return BOX4

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(4, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        if self.t == self.fail_at:
            raise RuntimeError("simulator crashed")
        done = self.t % 10 == 0
        agents, self.agents = self.agents, [] if done else self.agents
        return (
            {a: np.zeros(4, np.float32) for a in agents},
            {a: self.reward() for a in agents},
            {a: done for a in agents},
            {a: False for a in agents},
            {a: {} for a in agents},
        )

    def reward(self) -> Any:
        return 1.0


class NoResetOptions(ParallelSteps):
    """PettingZoo's older API: reset() takes a seed and no options (not a bad env: it must run)."""

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:  # type: ignore[override]
        return super().reset(seed)


class VectorRewards(ParallelSteps):
    """Each agent's reward is an array of one number."""

    def reward(self) -> Any:
        return np.array([1.0])


class FourValues(ParallelSteps):
    """step() returns four dicts, without truncations (PettingZoo before 1.22 had "dones")."""

    def step(self, actions: dict[str, Any]) -> Any:
        observations, rewards, terminations, _, infos = super().step(actions)
        return observations, rewards, terminations, infos


class NoPossibleAgents(ParallelSteps):
    """Agents known only once reset() made them: no `possible_agents`."""

    def __init__(self) -> None:
        self.agents, self.fail_at, self.t = [], 0, 0


class TurnSteps(AECEnv):
    """Two agents taking turns (AEC), 10 turns a game; step() raises at turn `fail_at`."""

    metadata = {"name": "turn_steps_v0"}

    def __init__(self, fail_at: int = 0) -> None:
        self.possible_agents = list(AGENTS)
        self.fail_at, self.t = fail_at, 0

    def observation_space(self, agent: str) -> gym.Space:
        return BOX4

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.zeros(4, np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents, self.t = list(self.possible_agents), 0
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action: Any) -> None:
        if self.terminations[self.agent_selection]:
            self._was_dead_step(action)
            return
        self.t += 1
        if self.t == self.fail_at:
            raise ValueError("illegal state")
        self._cumulative_rewards[self.agent_selection] = 0.0
        self.rewards = {a: 1.0 for a in self.agents}
        if self.t >= 10:
            self.terminations = {a: True for a in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()
