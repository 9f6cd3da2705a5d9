"""ListifyDataForVectorEnv: per-episode module outputs back into one [num envs, ...] array per column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.batching import batch_items, is_batched
from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class ListifyDataForVectorEnv(ConnectorV2):
    """Stack each per-episode column, in episode order, into a [B, ...] array; batched columns stay.

    The output is the same on both paths: a dict of [B, ...] arrays (STATE_OUT a dict of them) whose row
    i belongs to episodes[i]. RLlib stacks only ACTIONS and ACTIONS_FOR_ENV and keeps the other columns
    as lists; indexing a row works the same on either. Multi-agent (as RLlib): each column becomes a list with
    one `{agent id: item}` dict per episode, in episode order.
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
        if is_multi_agent(episodes):
            position = {episode.id_: i for i, episode in enumerate(episodes)}
            for column, data in batch.items():
                per_episode: list[dict] = [{} for _ in episodes]
                for (eps_id, agent_id, _module_id), items in data.items():
                    per_episode[position[eps_id]][agent_id] = items[0]
                batch[column] = per_episode
            return batch
        for column, data in batch.items():
            if not is_batched(data):
                items = data if isinstance(data, list) else [item for items in data.values() for item in items]
                batch[column] = batch_items(items)
        return batch
