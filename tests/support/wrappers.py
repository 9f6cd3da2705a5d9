"""Env wrappers a run spec names by import path: one that works, and ones that break their spaces the ways a
user's wrapper does (for the errors that must name the wrapper)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


class Scale(gym.ObservationWrapper):
    """Box observations times `factor`, in a Box scaled alike."""

    def __init__(self, env: gym.Env, factor: float) -> None:
        super().__init__(env)
        self.factor = factor
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low * factor, space.high * factor, dtype=space.dtype)

    def observation(self, observation: Any) -> Any:
        return (observation * self.factor).astype(self.observation_space.dtype)


class WrongShape(gym.ObservationWrapper):
    """Declares Box(3,) observations and passes the env's own (CartPole's: shape (4,)) through."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def observation(self, observation: Any) -> Any:
        return observation


class NotASpace(gym.Wrapper):
    """Sets its observation space to a shape instead of a space."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = (4,)


class TextObservations(gym.ObservationWrapper):
    """Observations as text: a gymnasium space that travels on no wire."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Text(8)

    def observation(self, observation: Any) -> str:
        return "pole"


class Paced(gym.Wrapper):
    """Each step takes `step_s` seconds of wall time, as a simulator's would, and next to no CPU: a client that
    steps it for the tens of seconds a test waits leaves the cores to the processes under test."""

    def __init__(self, env: gym.Env, step_s: float = 0.002) -> None:
        super().__init__(env)
        self.step_s = step_s

    def step(self, action: Any) -> Any:
        time.sleep(self.step_s)
        return self.env.step(action)
