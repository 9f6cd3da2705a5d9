"""MultiAgentBatcher: the Batcher for multi-agent sessions (same greedy batching, pausing and flushing).

A request's rows are its sub-envs' MultiAgentEpisodes; `max_batch_size` counts sub-envs,
i.e. env steps; one batch concatenates every request's episodes and the acting core runs one
forward per module over all their acting agents. Each request gets its slice of the per-episode outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlgate.server.batcher import Batcher, Rows


class MultiAgentBatcher(Batcher):
    """Batches multi-agent requests: per explore flag, one ActingCore.act over all their episodes."""

    def _forward(self, requests: Sequence[Rows], explore: bool) -> tuple[dict[str, Any], int]:
        """One ActingCore.act over all the requests' episodes: per column, one dict per episode."""
        episodes = [episode for request in requests for episode in request.episodes]
        return self.core.act(episodes, explore), len(episodes)

    def _piece_state(self) -> None:
        """None: nothing to restore. Multi-agent pieces normalise, augment and flatten in the episodes and leave
        what they wrote there as it is when the pipeline runs again (as after a server's flush), so a batch run
        again adds no row twice; restoring their state would drop the failed batch's rows instead."""
        return None
