"""Corridor: walk right to the end of a corridor of `length` cells (RLlib's SimpleCorridor, with kwargs).

Observation: the agent's cell, a Discrete(length). Actions: 0 left, 1 right. Each step costs 0.1; reaching
the last cell pays 1 and ends the episode; after `max_steps` steps it is truncated.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class Corridor(gym.Env):
    """A corridor of `length` cells; start in cell 0, the goal is the last one."""

    def __init__(self, length: int = 8, max_steps: int = 50) -> None:
        self.length, self.max_steps = length, max_steps
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)
        self._cell = self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        super().reset(seed=seed)
        self._cell = self._t = 0
        return self._cell, {}

    def step(self, action: Any) -> tuple[int, float, bool, bool, dict]:
        self._t += 1
        self._cell = min(max(self._cell + (1 if int(action) == 1 else -1), 0), self.length - 1)
        at_goal = self._cell == self.length - 1
        return self._cell, 1.0 if at_goal else -0.1, at_goal, self._t >= self.max_steps and not at_goal, {}
