"""CartPole for load generation: N sub-envs as numpy arrays, so that stepping them costs the client ~nothing.

`SyntheticCartPole` has gymnasium's CartPole-v1 dynamics (Euler integration, 500-step limit) and the
interface of a gymnasium vector env with autoreset mode NEXT_STEP (the step after an episode ends
returns a reset observation with reward 0 and both flags False), without gymnasium's per-step checks.
`make_env(..., real=True)` gives gymnasium's own vectorised CartPole-v1 instead.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

_GRAVITY, _CART_MASS, _POLE_MASS, _HALF_LENGTH, _FORCE, _TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
_TOTAL_MASS = _CART_MASS + _POLE_MASS
_POLE_MASS_LENGTH = _POLE_MASS * _HALF_LENGTH
_X_LIMIT, _THETA_LIMIT, _MAX_STEPS = 2.4, 12 * 2 * np.pi / 360, 500


class SyntheticCartPole:
    """`num_envs` CartPoles stepped together; reset() and step() return what a gymnasium vector env does."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self._rng = np.random.default_rng()
        self._state = np.zeros((4, num_envs))  # x, x_dot, theta, theta_dot
        self._steps = np.zeros(num_envs, np.int64)
        self._ended = np.zeros(num_envs, bool)
        self._ones = np.ones(num_envs, np.float32)

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict]:
        self._rng = np.random.default_rng(seed)
        self._state = self._rng.uniform(-0.05, 0.05, (4, self.num_envs))
        self._steps[:] = 0
        self._ended[:] = False
        return self._state.T.astype(np.float32), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        state = self._state
        x_dot, theta, theta_dot = state[1], state[2], state[3]
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (_FORCE * (2 * actions - 1) + _POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / _TOTAL_MASS
        theta_acc = (_GRAVITY * sin - cos * temp) / (_HALF_LENGTH * (4 / 3 - _POLE_MASS * cos * cos / _TOTAL_MASS))
        x_acc = temp - _POLE_MASS_LENGTH * theta_acc * cos / _TOTAL_MASS
        state += _TAU * np.stack((x_dot, x_acc, theta_dot, theta_acc))  # Euler: rates of the old state
        self._steps += 1
        terminated = (np.abs(state[0]) > _X_LIMIT) | (np.abs(state[2]) > _THETA_LIMIT)
        truncated = self._steps >= _MAX_STEPS
        reward = self._ones
        resetting = self._ended  # ended last step: this step only resets them
        if resetting.any():
            state[:, resetting] = self._rng.uniform(-0.05, 0.05, (4, int(resetting.sum())))
            self._steps[resetting] = 0
            reward = np.where(resetting, np.float32(0), reward)
            terminated[resetting] = False
            truncated[resetting] = False
        self._ended = terminated | truncated
        return state.T.astype(np.float32), reward, terminated, truncated, {}


def make_env(num_envs: int, *, real: bool) -> SyntheticCartPole | gym.vector.VectorEnv:
    """`num_envs` CartPoles: synthetic numpy ones, or gymnasium's CartPole-v1 vector env when `real`."""
    if real:
        return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
    return SyntheticCartPole(num_envs)


def spaces() -> tuple[gym.Space, gym.Space]:
    """CartPole-v1's single observation and action spaces (what the client declares in its hello)."""
    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space
