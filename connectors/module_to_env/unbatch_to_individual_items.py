"""UnBatchToIndividualItems: module outputs handed back per episode (per-episode path only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.tree import unbatch

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class UnBatchToIndividualItems(ConnectorV2):
    """Split each [B, ...] column into `{(episode id,): [row]}` by `shared_data["memorized_map_structure"]`.

    Only when env-to-module batched per-episode observations (BatchIndividualItems then wrote that map).
    On the batched fast path there is no map and the columns stay [B, ...] arrays (row i is episodes[i]).
    """

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
        row_episode_ids = (shared_data or {}).get("memorized_map_structure")
        if row_episode_ids is None:
            return batch
        for column, data in batch.items():
            per_episode: dict[tuple, list] = {}
            for eps_id, row in zip(row_episode_ids, unbatch(data), strict=True):
                per_episode.setdefault((eps_id,), []).append(row)
            batch[column] = per_episode
        return batch
