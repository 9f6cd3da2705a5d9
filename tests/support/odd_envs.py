"""Envs with spaces rlgate cannot take, for `rlgate` processes to name (`--env tests.support.odd_envs:NAME`).

Importable on their own (no test helpers), as a subprocess imports them from the repository root.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class _OddEnv(gym.Env):
    """An env that never gets to step: the command refuses its spaces first."""

    observation_space: gym.Space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space: gym.Space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


class MultiBinaryActions(_OddEnv):
    """Actions the default model has no distribution for."""

    action_space = gym.spaces.MultiBinary(3)


class SequenceObservations(_OddEnv):
    """Observations the wire has no encoding for."""

    observation_space = gym.spaces.Sequence(gym.spaces.Box(-1, 1, (2,), np.float32))


class HugeDiscreteActions(_OddEnv):
    """A billion actions: the default model's policy head alone would have 64e9 weights."""

    action_space = gym.spaces.Discrete(10**9)


class HugeMultiDiscreteObservations(_OddEnv):
    """Observations that one-hot into 2e9 values: the model's first layer would be far too large."""

    observation_space = gym.spaces.MultiDiscrete([10**9, 10**9])


class TextObservations(_OddEnv):
    """Observations that are strings: no model of rlgate's takes them."""

    observation_space = gym.spaces.Text(8)


class GraphObservations(_OddEnv):
    """Observations that are graphs: no model of rlgate's takes them."""

    observation_space = gym.spaces.Graph(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3))
