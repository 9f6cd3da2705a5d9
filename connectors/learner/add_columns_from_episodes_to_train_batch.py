"""AddColumnsFromEpisodesToTrainBatch: actions, rewards, done flags and extra model outputs for training."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class AddColumnsFromEpisodesToTrainBatch(ConnectorV2):
    """Add ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS and every extra model output but the states.

    Each episode adds its `len(episode)` steps as one batched item per column; a column already in the
    batch is left alone. TERMINATEDS/TRUNCATEDS are False but on the last step, which carries the
    episode's flag.
    """

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
        skip = set(batch) | {Columns.STATE_IN, Columns.STATE_OUT}
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            for column, steps in _step_columns(episode, skip):
                self.add_n_batch_items(batch, column, steps, len(episode), episode)
        return batch


def _step_columns(episode: SingleAgentEpisode, skip: set[str]) -> Iterator[tuple[str, Any]]:
    """(column, the episode's steps of it) for each column not in `skip`."""
    steps = slice(0, len(episode))
    if Columns.ACTIONS not in skip:
        yield Columns.ACTIONS, episode.get_actions(steps)
    if Columns.REWARDS not in skip:
        yield Columns.REWARDS, episode.get_rewards(steps)
    for column, flag in (
        (Columns.TERMINATEDS, episode.is_terminated),
        (Columns.TRUNCATEDS, episode.is_truncated),
    ):
        if column not in skip:
            flags = np.zeros(len(episode), dtype=bool)
            flags[-1:] = flag
            yield column, flags
    for column in episode.extra_model_outputs:
        if column not in skip:
            yield column, episode.get_extra_model_outputs(column, steps)
