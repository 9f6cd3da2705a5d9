"""Frames: a small uint8 image env whose every frame says which step of its episode it is, so a test can read a
frame stack and tell whether it holds the right frames, in order."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SHAPE = (6, 6, 1)


class Frames(gym.Env):
    """Observation t of an episode (t = 0 at reset) is a 6x6x1 uint8 frame filled with t + 1, so 0 is never a
    frame of its own (it is frame stacking's padding before the episode's start). Reward 1 per step; the
    episode terminates after `length` steps; two actions, both alike."""

    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 40) -> None:
        self.length = length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        return self._frame(), 1.0, self._t >= self.length, False, {}

    def _frame(self) -> np.ndarray:
        return np.full(SHAPE, self._t + 1, np.uint8)
