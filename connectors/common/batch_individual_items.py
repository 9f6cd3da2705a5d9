"""BatchIndividualItems: every per-episode column stacked into one array (already batched ones left alone)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.connectors.batching import BatchedNdArray, batch_items, is_batched, num_rows
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns
from rlgate.core.tree import first_leaf

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class BatchIndividualItems(ConnectorV2):
    """Stack each column's items, in episode order, into one (nested) array; INFOS become one list.

    With `multi_agent`, the batch is AgentToModuleMapping's `{module id: {column: [items]}}` and each module's
    columns are stacked (RLlib's `BatchIndividualItems(multi_agent=True)`).

    A column that is already batched (the fast path's OBS) stays as it is. When OBS is stacked from
    per-episode items, `shared_data["memorized_map_structure"]` records the episode id of each row, so that
    module-to-env's UnBatchToIndividualItems can hand rows back per episode; when OBS arrived batched it
    is not written, and module-to-env keeps its columns batched.
    """

    accepts_batched_obs = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        multi_agent: bool = False,
        **kwargs: Any,
    ) -> None:
        self.multi_agent = multi_agent
        super().__init__(input_observation_space, input_action_space, **kwargs)

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
        if self.multi_agent:
            for module_data in batch.values():
                for column, items in module_data.items():
                    if isinstance(items, list) and column != Columns.INFOS:
                        module_data[column] = batch_items(items)
            return batch
        batched_obs = batch.get(Columns.OBS)
        fast_path_rows = num_rows(batched_obs) if batched_obs is not None and is_batched(batched_obs) else None
        for column, data in batch.items():
            if is_batched(data):
                continue
            items = data if isinstance(data, list) else [item for items in data.values() for item in items]
            if column == Columns.INFOS:
                batch[column] = items
                continue
            batch[column] = batch_items(items)
            if fast_path_rows is not None and num_rows(batch[column]) != fast_path_rows:
                raise ValueError(
                    f"column {column!r} has {num_rows(batch[column])} rows but the batched OBS has "
                    f"{fast_path_rows}: per-episode pieces must add exactly one item per episode"
                )
            if column == Columns.OBS and isinstance(data, dict):
                assert shared_data is not None  # pipelines always pass one
                shared_data["memorized_map_structure"] = [
                    key[0] for key, items in data.items() for item in items for _ in range(_item_rows(item))
                ]
        return batch


def _item_rows(item: Any) -> int:
    return num_rows(item) if isinstance(first_leaf(item), BatchedNdArray) else 1
