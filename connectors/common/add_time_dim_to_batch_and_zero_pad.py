"""AddTimeDimToBatchAndZeroPad: the time axis a stateful module expects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlgate.connectors.batching import BatchedNdArray, batch_items, is_batched
from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_rl_module
from rlgate.connectors.zero_padding import create_mask_and_seq_lens, split_and_zero_pad
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class AddTimeDimToBatchAndZeroPad(ConnectorV2):
    """Give every column a time axis when the module is stateful (a no-op for stateless modules).

    Env-to-module: a time axis of 1 ([B, ...] -> [B, 1, ...]), and
    `shared_data["_added_single_ts_time_rank"]` so that module-to-env's RemoveSingleTsTimeRankFromBatch
    takes it off again.
    Learner: each episode's steps are cut into sequences of `rl_module.model_config["max_seq_len"]` steps,
    the last one zero-padded, and SEQ_LENS [N] plus LOSS_MASK [N, T] (False on padding; unless an earlier
    piece added LOSS_MASK already) are added. Multi-agent: only the items of stateful modules' agents, each with
    its module's `max_seq_len`.
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
        if rl_module is None or not rl_module.is_stateful() or Columns.STATE_IN in batch:
            return batch
        assert shared_data is not None  # pipelines always pass one
        if self._as_learner_connector:
            self._zero_pad(rl_module, batch, episodes, shared_data)
        else:

            def add_single_ts(item: Any, eps_id: Any, agent_id: Any, module_id: Any) -> Any:
                if module_id is not None and not rl_module[module_id].is_stateful():
                    return item
                # An item that already has a batch axis gets the time axis after it.
                return map_structure(lambda a: np.expand_dims(a, 1 if isinstance(a, BatchedNdArray) else 0), item)

            for column, data in batch.items():
                if is_batched(data):
                    batch[column] = map_structure(lambda a: np.expand_dims(a, 1), data)
                else:
                    self.foreach_batch_item_change_in_place(batch, column, add_single_ts)
            shared_data["_added_single_ts_time_rank"] = True
        return batch

    def _zero_pad(
        self, rl_module: RLModule, batch: dict[str, Any], episodes: Sequence[SingleAgentEpisode], shared_data: dict
    ) -> None:
        def module(module_id: str | None) -> RLModule:
            return rl_module[module_id] if is_multi_rl_module(rl_module) else rl_module

        for column, data in batch.items():
            if column == Columns.INFOS:
                continue
            for key, items in data.items():
                sa_module = module(key[2] if len(key) == 3 else None)
                if not sa_module.is_stateful():
                    continue
                sequences = split_and_zero_pad(batch_items(items), sa_module.model_config["max_seq_len"])
                data[key] = [map_structure(lambda a: a.view(BatchedNdArray), sequences)]
        add_loss_mask = not shared_data.get("_added_loss_mask_for_valid_episode_ts")
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            sa_module = module(episode.module_id)
            if not sa_module.is_stateful():
                continue
            mask, seq_lens = create_mask_and_seq_lens(len(episode), sa_module.model_config["max_seq_len"])
            self.add_n_batch_items(batch, Columns.SEQ_LENS, seq_lens, len(seq_lens), episode)
            if add_loss_mask:
                self.add_n_batch_items(batch, Columns.LOSS_MASK, mask, len(mask), episode)
