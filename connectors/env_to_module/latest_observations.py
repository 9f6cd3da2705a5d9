"""The episodes' latest observations for pieces that transform them, on both paths, and their write-back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.connectors.batching import batch_items, is_batched
from rlgate.core.columns import Columns
from rlgate.core.tree import unbatch
from rlgate.episodes.rows import EpisodeRows

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode


def get_latest_observations(batch: dict[str, Any], episodes: Sequence[SingleAgentEpisode]) -> Any:
    """The latest observation of each episode as one [B, ...] batch: the batched OBS column of the fast
    path as it is, or else gathered from the episodes."""
    observations = batch.get(Columns.OBS)
    if observations is not None and is_batched(observations):
        return observations
    return batch_items([episode.get_observations(-1) for episode in episodes])


def set_latest_observations(
    batch: dict[str, Any],
    episodes: Sequence[SingleAgentEpisode],
    observations: Any,
    observation_space: gym.Space | None,
) -> None:
    """Write transformed observations ([B, ...], row i for episodes[i]) over each episode's latest one.

    The episodes keep them (so the learner trains on what the module saw) and take the new observation
    space; a batched OBS column is replaced too. List-mode episodes take any new shape; numpy-mode
    (finalized) ones only their stored shape and dtype. Column-stored episodes (`EpisodeRows`, the
    server's) take the whole batch in one write.
    """
    if isinstance(episodes, EpisodeRows):
        episodes.set_latest_observations(observations, observation_space)
    else:
        for episode, row in zip(episodes, unbatch(observations), strict=True):
            episode.set_observations(new_data=row, at_indices=-1)
            if episode.observation_space is not observation_space:
                episode.observation_space = observation_space
    if Columns.OBS in batch and is_batched(batch[Columns.OBS]):
        batch[Columns.OBS] = observations
