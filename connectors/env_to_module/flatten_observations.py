"""FlattenObservations: Dict/Tuple/Discrete/MultiDiscrete/MultiBinary observations as one flat float32 Box."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations
from rlgate.core.spaces import one_hot, space_struct
from rlgate.core.tree import flatten, map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class FlattenObservations(ConnectorV2):
    """Flatten the latest observations to [B, n] float32: leaves in space order, Discrete and MultiDiscrete
    parts one-hot, Box and MultiBinary parts flattened.

    One vectorised pass over the batch (the fast path's batched, possibly nested OBS, or the observations
    gathered from the episodes); the flat observations are written back into the episodes (as RLlib does),
    which therefore must be in list mode (numpy-mode episodes keep their stored shapes).
    """

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        sample = map_structure(lambda s: np.asarray(s.sample())[None], space_struct(input_observation_space))
        size = flatten_batch(sample, input_observation_space).shape[1]
        return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: list[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if episodes:
            flat = flatten_batch(get_latest_observations(batch, episodes), self.input_observation_space)
            set_latest_observations(batch, episodes, flat, self.observation_space)
        return batch


def flatten_batch(observations: Any, space: gym.Space) -> np.ndarray:
    """A [B, ...] (nested) batch of `space` observations as [B, n] float32, discrete parts one-hot."""
    struct = space_struct(space)
    ordered = map_structure(lambda _, leaf: leaf, struct, observations)  # in the space's key order
    leaves = flatten(one_hot(ordered, struct))
    rows = len(leaves[0])
    return np.concatenate([np.asarray(leaf, np.float32).reshape(rows, -1) for leaf in leaves], axis=1)
