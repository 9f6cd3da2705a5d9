"""AddObservationsFromEpisodesToBatch: the OBS column, gathered from the episodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.connector_v2 import ConnectorV2, make_episode_keys_unique
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class AddObservationsFromEpisodesToBatch(ConnectorV2):
    """Add each episode's latest observation (env-to-module) or all its observations (learner) as OBS.

    MultiAgentEpisodes add their agents' episodes: in env-to-module the agents that observed at the latest env
    step (keyed by (episode id, agent id, module id)), in the learner all of them.

    A batch that already has OBS is left alone: the batched fast path (the server passes the latest
    observations as one array) and pieces such as FrameStacking that build OBS themselves.
    Env-to-module, it refuses numpy'd episodes (`to_numpy()`), as RLlib's does: env-to-module works on
    the running, list-mode episodes. RLlib asserts (a bare AssertionError, gone under `python -O`); here
    it is a ValueError that says which episode.
    As a learner connector, each episode adds `len(episode)` observations (the final one is left out)
    as one batched item, after the episode ids are renamed as RLlib renames them
    (`make_episode_keys_unique`).
    """

    accepts_batched_obs = True

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
        if Columns.OBS in batch:
            return batch
        if not self._as_learner_connector:
            numpy_episode = next((e for e in episodes if e.is_numpy), None)
            if numpy_episode is not None:
                raise ValueError(
                    f"episode {numpy_episode.id_} is numpy'd (to_numpy()): an env-to-module pipeline "
                    "works on running list-mode episodes"
                )
            for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
                self.add_batch_item(batch, Columns.OBS, episode.get_observations(-1), episode)
            return batch
        make_episode_keys_unique(episodes)
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            observations = episode.get_observations(slice(0, len(episode)))
            self.add_n_batch_items(batch, Columns.OBS, observations, len(episode), episode)
        return batch
