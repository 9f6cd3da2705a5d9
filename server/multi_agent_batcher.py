"""MultiAgentBatcher: the Batcher for multi-agent sessions (same greedy batching, pausing and flushing).

A request's rows are its sub-envs' MultiAgentEpisodes (a SubEnvEpisodes list; `max_batch_size` counts
sub-envs, i.e. env steps); one batch concatenates every request's episodes and the MultiAgentPolicy runs one
forward per module over all their acting agents. Each request gets its slice of the per-episode outputs.
"""

from __future__ import annotations

import time
from typing import Any

from rlgate.server.batcher import Batcher, Request


class MultiAgentBatcher(Batcher):
    """Batches multi-agent requests: per explore flag, one MultiAgentPolicy.compute over all their episodes."""

    def _take(self) -> list[Request]:
        """As Batcher's, but a request counts the steps its session has not shipped by a flush yet (a flush while
        it waited ships them with the completed version's steps, so the next version must not count them)."""
        taken = super()._take()
        for request in taken:
            request.env_steps = request.episodes.uncounted
        return taken

    def _compute(self, requests: list[Request]) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [None] * len(requests)
        for explore in (True, False):
            group = [i for i, r in enumerate(requests) if r.explore == explore]
            if not group:
                continue
            episodes = [episode for i in group for episode in requests[i].episodes]
            started = time.perf_counter()
            outputs = self.policy.compute(episodes, explore)
            self.metrics.forward_seconds.observe(time.perf_counter() - started)
            self.metrics.batch_size.observe(len(episodes))
            start = 0
            for i in group:
                stop = start + len(requests[i].episodes)
                results[i] = {column: rows[start:stop] for column, rows in outputs.items()}
                start = stop
        return results  # type: ignore[return-value]
