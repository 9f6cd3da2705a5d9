"""ModuleToAgentUnmapping: per-module module outputs back into one batch keyed by (episode, agent, module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent

if TYPE_CHECKING:
    from rlgate.episodes import MultiAgentEpisode
    from rlgate.models import RLModule


class ModuleToAgentUnmapping(ConnectorV2):
    """`{module id: {column: {(eps id, agent id, module id): [items]}}}` -> `{column: {key: [items]}}`.

    Runs after UnBatchToIndividualItems (which split each module's rows by agent) in a multi-agent
    module-to-env pipeline, as in RLlib; a single-agent batch passes through.
    """

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[MultiAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if not is_multi_agent(episodes):
            return batch
        by_column: dict[str, dict] = {}
        for module_data in batch.values():
            for column, per_agent in module_data.items():
                by_column.setdefault(column, {}).update(per_agent)
        return by_column
