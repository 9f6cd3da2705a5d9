"""RemoveSingleTsTimeRankFromBatch: takes off the time axis of 1 that env-to-module added."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlgate.connectors.batching import is_batched
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class RemoveSingleTsTimeRankFromBatch(ConnectorV2):
    """Squeeze the time axis out of every column but STATE_OUT, if `_added_single_ts_time_rank` is set.

    Batched columns lose axis 1 ([B, 1, ...] -> [B, ...]); per-episode items lose axis 0.
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
        if not (shared_data or {}).get("_added_single_ts_time_rank"):
            return batch
        for column, data in batch.items():
            if column == Columns.STATE_OUT:
                continue
            if is_batched(data):
                batch[column] = map_structure(lambda a: np.squeeze(a, axis=1), data)
            else:

                def squeeze_time(item: Any, eps_id: Any, agent_id: Any, module_id: Any) -> Any:
                    if module_id is not None and rl_module is not None and not rl_module[module_id].is_stateful():
                        return item  # a multi-agent batch's stateless module never got the time axis
                    return map_structure(lambda a: np.squeeze(a, axis=0), item)

                self.foreach_batch_item_change_in_place(batch, column, squeeze_time)
        return batch
