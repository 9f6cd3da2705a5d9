"""FrameStacking: each observation stacked with the previous `num_frames - 1` along its last axis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2, make_episode_keys_unique
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def stack_frames(frames: np.ndarray) -> np.ndarray:
    """[k, ..., d] consecutive frames (oldest first) -> [..., k * d] (each frame's d values together)."""
    return np.moveaxis(frames, 0, -2).reshape(*frames.shape[1:-1], -1)


class FrameStacking(ConnectorV2):
    """Stack Box observations with their `num_frames - 1` predecessors (zeros before the episode start):
    shape [..., d] -> [..., num_frames * d]; for images [H, W, 1] -> [H, W, num_frames] as in RLlib.

    Env-to-module (`FrameStackingEnvToModule`): sets OBS to the batched stacks of the episodes' latest
    frames (replacing a batched OBS; the episodes keep single frames). Learner (`FrameStackingLearner`):
    adds every step's stack as OBS, so the default AddObservationsFromEpisodesToBatch leaves OBS alone.
    Taking that piece's place, it first renames episode ids as that piece does (`make_episode_keys_unique`;
    RLlib's FrameStacking renames none, mixing chunks of one episode unless PPO's
    AddOneTsToEpisodesAndTruncate renamed them before, after which this renames nothing either).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        num_frames: int = 1,
        **kwargs: Any,
    ) -> None:
        self.num_frames = num_frames
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        if not isinstance(input_observation_space, gym.spaces.Box):
            raise ValueError(f"FrameStacking needs a Box observation space, not {input_observation_space}")
        low, high = (
            np.concatenate([bound] * self.num_frames, axis=-1)
            for bound in (input_observation_space.low, input_observation_space.high)
        )
        return gym.spaces.Box(low, high, dtype=input_observation_space.dtype)

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
        k = self.num_frames
        if not self._as_learner_connector:
            if episodes:
                latest = [np.asarray(e.get_observations(slice(-k, None), fill=0.0)) for e in episodes]
                batch[Columns.OBS] = np.stack([stack_frames(frames) for frames in latest])
            return batch
        make_episode_keys_unique(episodes)
        for episode in episodes:
            frames = episode.get_observations(slice(-k + 1, len(episode)), neg_index_as_lookback=True, fill=0.0)
            windows = np.lib.stride_tricks.sliding_window_view(np.asarray(frames), k, axis=0)  # [n, ..., d, k]
            stacks = np.moveaxis(windows, -1, -2).reshape(len(episode), *windows.shape[1:-2], -1)
            self.add_n_batch_items(batch, Columns.OBS, stacks, len(episode), episode)
        return batch
