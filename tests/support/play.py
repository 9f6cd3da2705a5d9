"""A policy playing one CartPole-v1 episode (imports no torch: a torch-free process runs it too)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def play(policy: Any, seed: int, steps: int = 200) -> list[int]:
    """The actions `policy` (a Policy or OnnxPolicy) takes in one CartPole episode reset with `seed`, at most
    `steps` of them, passing each step's reward on."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    episode, reward, actions = policy.new_episode(), 0.0, []
    for _ in range(steps):
        action = policy.compute_action(obs, episode, reward=reward)
        actions.append(int(action))
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return actions
