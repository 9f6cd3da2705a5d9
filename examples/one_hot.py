"""OneHot: an ObservationPreprocessor turning a Discrete observation into a one-hot float vector."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.env_to_module import ObservationPreprocessor


class OneHot(ObservationPreprocessor):
    """Discrete(n) observation k -> float32 vector of n zeros with a one at k (RLlib's docs example)."""

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (int(input_observation_space.n),), np.float32)

    def preprocess(self, observation: Any, episode: Any) -> np.ndarray:
        return np.eye(int(self.input_observation_space.n), dtype=np.float32)[int(observation)]
