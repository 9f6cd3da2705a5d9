"""AddPrevReward: an env-to-module piece appending the previous reward to each observation."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.connectors import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations


class AddPrevReward(ConnectorV2):
    """Box(n) observations -> Box(n + 1): the reward that came with the observation appended (0 after reset).

    Written back into the episodes, so the learner trains on what the module saw.
    """

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        low = np.append(input_observation_space.low, -np.inf).astype(np.float32)
        high = np.append(input_observation_space.high, np.inf).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        if episodes:
            observations = np.asarray(get_latest_observations(batch, episodes), np.float32)
            rewards = np.array([e.get_rewards(-1) if len(e) else 0.0 for e in episodes], np.float32)
            set_latest_observations(
                batch, episodes, np.concatenate([observations, rewards[:, None]], 1), self.observation_space
            )
        return batch
