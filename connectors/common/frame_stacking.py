"""FrameStacking: each observation stacked with the previous `num_frames - 1` along its last axis."""

from __future__ import annotations

from collections.abc import Sequence
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

    Multi-agent (`multi_agent`, RLlib's option): the spaces are Dicts by agent id (env-to-module) or by module
    id (learner), each Box stacked. Env-to-module, each agent that observed at the latest env step adds the
    stack of its own episode's latest frames (an agent that joined late starts from zeros; a terminated agent's
    last frame, repeated by its MultiAgentEpisode, counts twice, as in RLlib); the learner stacks every step of
    each agent's episode. Nothing is written back, so running the pipeline again over the same episodes (a
    server's flush, then the successor chunk's step) stacks the same frames again, never stacks of stacks; pieces
    that change observations must come before it (they write into the episodes, which it reads).
    """

    accepts_batched_obs = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        num_frames: int = 1,
        multi_agent: bool = False,
        **kwargs: Any,
    ) -> None:
        self.num_frames = num_frames
        self.multi_agent = multi_agent
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        if not self.multi_agent:
            return self._stacked_space(input_observation_space)
        if not isinstance(input_observation_space, gym.spaces.Dict):
            raise ValueError(
                f"FrameStacking(multi_agent=True) needs a Dict space by agent id, not {input_observation_space}"
            )
        return gym.spaces.Dict(
            {key: self._stacked_space(space, key) for key, space in input_observation_space.spaces.items()}
        )

    def _stacked_space(self, space: gym.Space, key: str | None = None) -> gym.spaces.Box:
        if not isinstance(space, gym.spaces.Box):
            whose = "" if key is None else f" for {key!r}"
            raise ValueError(f"FrameStacking needs a Box observation space{whose}, not {space}")
        low, high = (np.concatenate([bound] * self.num_frames, axis=-1) for bound in (space.low, space.high))
        return gym.spaces.Box(low, high, dtype=space.dtype)

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        k = self.num_frames
        if not self._as_learner_connector:
            if self.multi_agent:
                for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
                    self.add_batch_item(batch, Columns.OBS, self._latest_stack(episode), episode)
            elif episodes:
                batch[Columns.OBS] = np.stack([self._latest_stack(episode) for episode in episodes])
            return batch
        make_episode_keys_unique(episodes)
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            frames = episode.get_observations(slice(-k + 1, len(episode)), neg_index_as_lookback=True, fill=0.0)
            windows = np.lib.stride_tricks.sliding_window_view(np.asarray(frames), k, axis=0)  # [n, ..., d, k]
            stacks = np.moveaxis(windows, -1, -2).reshape(len(episode), *windows.shape[1:-2], -1)
            self.add_n_batch_items(batch, Columns.OBS, stacks, len(episode), episode)
        return batch

    def _latest_stack(self, episode: SingleAgentEpisode) -> np.ndarray:
        """The stack of the episode's latest `num_frames` frames (zeros before its start)."""
        return stack_frames(np.asarray(episode.get_observations(slice(-self.num_frames, None), fill=0.0)))
