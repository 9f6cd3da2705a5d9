"""Dynamic batching: many sessions' step requests, one forward pass.

Greedy, with no fixed delay: whenever the previous batch is done, the batcher takes every request
that has arrived (up to `max_batch_size` env steps) and runs it at once, so a lone client never pays
for batching. Nothing waits for requests still to come: stream handlers decode and queue a message
without yielding to the event loop, so by the time the batcher's task runs, every message read since
the last batch is queued. Requests of sessions that explore and of sessions that act greedily go into
separate forward passes.

Sampling keeps the learner's pace: the batcher pauses while `waiting_for_acks()` says the learner has
not taken enough of what this server shipped (the learner's window of unacknowledged steps), and while
`backlogged()` says the spool is full, until `wake()`. While waiting for acks it calls `flush()` on every
wake-up, so that every step taken so far reaches the learner, which therefore never waits for data that
sits in a paused server's running episodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from rlgate.core.tree import map_structure
from rlgate.episodes.multi_agent_episode import MultiAgentEpisode
from rlgate.episodes.rows import EpisodeRows
from rlgate.policy.acting import ActingCore
from rlgate.server.metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass
class Rows:
    """One session's step: its observations (rows = sub-envs) and the episodes they belong to (a multi-agent
    session's: its sub-envs' MultiAgentEpisodes)."""

    obs: Any
    episodes: EpisodeRows | list[MultiAgentEpisode]
    explore: bool


@dataclass
class Request(Rows):
    """Rows queued for the next batch, and where their outputs go."""

    future: asyncio.Future = field(repr=False)


class Batcher:
    """Collects requests from all sessions and runs them through the acting core, one batch at a time.

    With `thread`, batches run on a thread of their own, so the event loop keeps reading and writing
    streams during a forward pass (worth it when a forward is long: a GPU, a large model). Without, they
    run on the event loop itself, which saves two thread hand-offs per batch: for a small model on a CPU
    that is most of a lone client's wait.
    """

    def __init__(
        self,
        core: ActingCore,
        *,
        max_batch_size: int,
        metrics: ServerMetrics,
        waiting_for_acks: Callable[[], bool] = lambda: False,
        flush: Callable[[], None] = lambda: None,
        backlogged: Callable[[], bool] = lambda: False,
        thread: bool = False,
    ) -> None:
        self.core = core
        self._waiting_for_acks = waiting_for_acks
        self._flush = flush
        self._backlogged = backlogged
        self.max_batch_size = max_batch_size
        self.metrics = metrics
        self._queue: deque[Request] = deque()
        self._wakeup = asyncio.Event()
        self._held = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgate-inference") if thread else None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlgate-batcher")

    async def stop(self) -> None:
        """Fail what is still queued and stop the inference thread, if there is one."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self._queue:
            request = self._queue.popleft()
            if not request.future.done():
                request.future.set_exception(RuntimeError("server is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None  # no batch runs any more: `between_batches` is any time now

    async def compute(
        self, obs: Any, episodes: EpisodeRows | list[MultiAgentEpisode], explore: bool, *, alone: bool = False
    ) -> dict[str, Any]:
        """Actions and extra outputs for these rows (same row order), from the next batch.

        `alone`: no other session is open, so no other request could join this one's batch. With nothing
        queued, no pause and batches on the event loop, the request is then run here at once, as the
        batcher's task would run it next, without the two task switches of handing it over and back
        (with the metrics change beside it, 9% of a lone CartPole client's server CPU per step here).
        """
        if alone and self._executor is None and not self._queue and not self.paused():
            return self._compute([Rows(obs, episodes, explore)])[0]
        future = asyncio.get_running_loop().create_future()
        self._queue.append(Request(obs, episodes, explore, future))
        self._wakeup.set()
        return await future

    def wake(self) -> None:
        """Look again whether to pause (the learner caught up, say)."""
        self._wakeup.set()

    def paused(self) -> bool:
        return self.pause_reason() is not None

    def hold(self, held: bool) -> None:
        """Run no batch while held (an on-policy server waits for the version it is to sample with)."""
        self._held = held
        if not held:
            self._wakeup.set()

    def pause_reason(self) -> str | None:
        """Why no batch runs now, if so: a new version is loading for on-policy sampling, the learner has not
        taken what was shipped, or the spool is full."""
        if self._held:
            return "loading the learner's new version (sampling and training take turns)"
        if self._waiting_for_acks():
            return "waiting for the learner to take the steps shipped"
        if self._backlogged():
            return "spool full: waiting for the learner"
        return None

    def _flush_if_waiting_for_acks(self) -> None:
        """Ship every step taken so far when the learner is to take them (a full spool alone does not flush:
        the learner has data, and flushing would only cut episodes short)."""
        if self._waiting_for_acks():
            try:
                self._flush()
            except Exception:  # a bug in shipping must not stop the batcher: every session would hang
                log.exception("flushing the sessions failed")

    async def between_batches(self, fn: Any, *args: Any) -> Any:
        """Run fn between two batches (a weight swap, taking connector statistics), never during one."""
        if self._executor is None:  # batches run on this loop: now is between two of them
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue and not self.paused():
                await self._answer(self._take())
                await asyncio.sleep(0)  # let the streams answered, and those whose messages arrived, go on
            self._flush_if_waiting_for_acks()

    async def _answer(self, requests: list[Request]) -> None:
        """Run one batch and settle its requests' futures.

        A batch that raises runs again request by request, so that a request whose rows make a piece or the
        model fail (a client's observation that passes the space checks but not a user's piece, say) fails
        alone, not every request that shared its batch. A failed batch never stops the batcher.
        """
        requests = [request for request in requests if not request.future.done()]  # the client may have gone
        if not requests:
            return
        try:
            if self._executor is None:
                results = self._compute_or_undo(requests)
            else:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._compute_or_undo, requests
                )
        except Exception as exc:
            if len(requests) > 1:
                log.warning("a batch of %d requests failed (%r): running them one by one", len(requests), exc)
                for request in requests:
                    await self._answer([request])
            elif not requests[0].future.done():
                requests[0].future.set_exception(exc)
            return
        for request, result in zip(requests, results, strict=True):
            if not request.future.done():  # the client may have gone meanwhile
                request.future.set_result(result)

    def _compute_or_undo(self, requests: Sequence[Rows]) -> list[dict[str, Any]]:
        """`_compute`; if a batch of several requests raises, first the env-to-module pieces' state is put back as
        it was before it (`_piece_state`), so that running the requests again one by one counts each row once in
        a stateful piece (MeanStdFilter's statistics, a user's piece's), not the failed batch's rows twice."""
        state = self._piece_state() if len(requests) > 1 else None
        try:
            return self._compute(requests)
        except Exception:
            if state is not None:
                self.core.env_to_module.set_state(state)
            raise

    def _piece_state(self) -> dict[str, Any] | None:
        """The env-to-module pieces' state to restore if a batch fails (see `_compute_or_undo`)."""
        return self.core.env_to_module.get_state()

    def _take(self) -> list[Request]:
        """Requests for one batch: whole requests, up to max_batch_size rows (at least one request)."""
        taken = [self._queue.popleft()]
        rows = len(taken[0].episodes)
        while self._queue and rows + len(self._queue[0].episodes) <= self.max_batch_size:
            request = self._queue.popleft()
            rows += len(request.episodes)
            taken.append(request)
        return taken

    def _compute(self, requests: Sequence[Rows]) -> list[dict[str, Any]]:
        """One forward per explore flag, then each request's slice of rows."""
        results: list[dict[str, Any] | None] = [None] * len(requests)
        for explore in (True, False):
            group = [i for i, r in enumerate(requests) if r.explore == explore]
            if not group:
                continue
            started = time.perf_counter()
            outputs, rows = self._forward([requests[i] for i in group], explore)
            self.metrics.forward_seconds.observe(time.perf_counter() - started)
            self.metrics.batch_size.observe(rows)
            if len(group) == 1:  # a lone request's rows are the whole batch (a lone client's every batch)
                results[group[0]] = outputs
                continue
            start = 0
            for i in group:
                stop = start + len(requests[i].episodes)
                results[i] = map_structure(lambda column, a=start, b=stop: column[a:b], outputs)
                start = stop
        return results  # type: ignore[return-value]

    def _forward(self, requests: Sequence[Rows], explore: bool) -> tuple[dict[str, Any], int]:
        """The core's outputs for these requests' rows, concatenated in order, and the number of rows."""
        parts = [request.obs for request in requests]
        obs = parts[0] if len(parts) == 1 else map_structure(lambda *rows: np.concatenate(rows), *parts)
        # Single-agent rows (EpisodeRows): MultiAgentBatcher has its own _forward.
        episode_parts = [cast(EpisodeRows, request.episodes) for request in requests]
        episodes = episode_parts[0] if len(episode_parts) == 1 else EpisodeRows.concat(episode_parts)
        return self.core.act(episodes, explore, obs), len(episodes)
