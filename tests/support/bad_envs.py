"""Envs that break gymnasium's contract the ways users' envs do, for the errors `rlgate env` must name."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


class Steps(gym.Env):
    """Box(4) observations, 2 actions; its step() raises at step `fail_at` (never at 0)."""

    observation_space = BOX4
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at = fail_at
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        if self.t == self.fail_at:
            raise RuntimeError("simulator crashed")
        return self.observe(), 1.0, False, self.t % 10 == 0, {}

    def observe(self) -> np.ndarray:
        return np.zeros(4, np.float32)


class WrongShape(Steps):
    """From step 3 on, observations of shape (5,) for its Box(4) space."""

    def observe(self) -> np.ndarray:
        return np.zeros(5 if self.t >= 3 else 4, np.float32)


class OldGymApi(Steps):
    """reset() returns the observation alone, as envs for gym before 0.26 did."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:  # type: ignore[override]
        return self.observe()


class NotAnEnv:
    """A class that is no gymnasium env."""


class Returns(gym.Env):
    """An env of `space` whose reset() returns `reset_obs` and whose step() returns `step_obs`."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, space: gym.Space, reset_obs: Any, step_obs: Any) -> None:
        self.observation_space = space
        self.reset_obs, self.step_obs = reset_obs, step_obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.reset_obs, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.step_obs, 0.0, False, False, {}


class VectorReward(Steps):
    """step()'s reward is an array of one number (a vector env would only say "setting an array element...")."""

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, np.array([reward]), terminated, truncated, info
