"""StatelessCartPole: CartPole-v1 without its two velocities, a partially observed env (a POMDP).

The cart position and pole angle alone do not say where the pole is going, so a memoryless policy
cannot balance it for long; frame stacking or an LSTM (with previous actions and rewards) can.
Importing this module registers `StatelessCartPole-v1` (500 steps, reward threshold 475), so a run
spec names it `examples.stateless_cartpole:StatelessCartPole-v1`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

KEPT = [0, 2]  # cart position and pole angle; the velocities (1, 3) are dropped


class StatelessCartPole(CartPoleEnv):
    """CartPole whose observation is (cart position, pole angle)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        full = self.observation_space
        self.observation_space = gym.spaces.Box(full.low[KEPT], full.high[KEPT], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[KEPT], info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[KEPT], reward, terminated, truncated, info


gym.register(
    "StatelessCartPole-v1",
    entry_point=StatelessCartPole,
    max_episode_steps=500,
    reward_threshold=475.0,
)
