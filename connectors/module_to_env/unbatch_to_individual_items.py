"""UnBatchToIndividualItems: module outputs handed back per episode (per-episode path only)."""

from __future__ import annotations

from collections.abc import Sequence
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
    Multi-agent (AgentToModuleMapping wrote `{module id: [(eps id, agent id), ...]}`): each module's columns
    are split into `{(eps id, agent id, module id): [row]}`.
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
        row_episode_ids = (shared_data or {}).get("memorized_map_structure")
        if row_episode_ids is None:
            return batch
        if isinstance(row_episode_ids, dict):
            for module_id, module_data in batch.items():
                rows = row_episode_ids[module_id]
                for column, data in module_data.items():
                    per_agent: dict[tuple, list] = {}
                    for (eps_id, agent_id), row in zip(rows, unbatch(data), strict=True):
                        per_agent.setdefault((eps_id, agent_id, module_id), []).append(row)
                    module_data[column] = per_agent
            return batch
        for column, data in batch.items():
            per_episode: dict[tuple, list] = {}
            for eps_id, row in zip(row_episode_ids, unbatch(data), strict=True):
                per_episode.setdefault((eps_id,), []).append(row)
            batch[column] = per_episode
        return batch
