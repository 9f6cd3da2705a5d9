"""AddNextObservationsFromEpisodesToTrainBatch: the NEXT_OBS column, for losses that learn from TD tuples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class AddNextObservationsFromEpisodesToTrainBatch(ConnectorV2):
    """Add each episode's observations after its steps (all but the first one) as NEXT_OBS (RLlib's piece).

    DQN's and SAC's learner pipelines hold it right after AddObservationsFromEpisodesToBatch, so step i's
    NEXT_OBS is the observation its action led to: for the one-step episodes a replay buffer samples, the one
    n steps later. A batch that already has NEXT_OBS is left alone (the replay buffer's columnar fast path).
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
        if Columns.NEXT_OBS in batch:
            return batch
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            next_observations = episode.get_observations(slice(1, len(episode) + 1))
            self.add_n_batch_items(batch, Columns.NEXT_OBS, next_observations, len(episode), episode)
        return batch
