"""The server's link to the learner: episode chunks out (spooled until acknowledged), weights in.

Shipping is at least once: `ship()` only queues; a writer task encodes the chunks into an
`EpisodeBatch` file in the spool directory; a sender task streams spool files to `SubmitEpisodes` and
deletes each only when its ack arrives. A broken stream is re-opened with backoff and every unacked
file is sent again (the learner drops duplicates by episode id and chunk index). A server that is
killed keeps its spool on disk and sends it after restart; only chunks still in memory are lost,
and `stop()` says how many.

The spool is bounded: once it holds `max_spool_bytes`, `full()` is true and the server stops sampling
(the batcher pauses) until acks bring it back under the limit, when `on_room` is called. A learner that
is down or slower than the servers therefore stalls the env clients instead of filling the disk; what
was already accepted still ships, so the spool overshoots the limit by at most the chunks in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from rlgate.core import codec
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.codec import episode_to_proto
from rlgate.server.metrics import ServerMetrics
from rlgate.service.auth import bearer_metadata
from rlgate.v1 import learner_pb2, learner_pb2_grpc

log = logging.getLogger(__name__)

SUBMIT = "/rlgate.v1.LearnerService/SubmitEpisodes"
# Batches sent but not yet acknowledged, at most.
MAX_IN_FLIGHT = 32
MAX_BACKOFF_S = 2.0


class LearnerLink:
    """Ships episode chunks to the learner through an on-disk spool, and feeds its weights to `on_weights`.

    `token` is sent as a bearer token; with `tls_ca` (PEM bytes) the learner is reached over TLS and
    verified by that CA.
    """

    def __init__(
        self,
        target: str,
        spool_dir: Path,
        *,
        server_id: str,
        on_weights: Callable[[learner_pb2.Weights], Awaitable[None]],
        current_version: Callable[[], int],
        connector_delta: Callable[[], Awaitable[dict]],
        metrics: ServerMetrics,
        max_spool_bytes: int,
        on_room: Callable[[], None] = lambda: None,
        token: str | None = None,
        tls_ca: bytes | None = None,
    ) -> None:
        self.target = target
        self.spool_dir = spool_dir
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.server_id = server_id
        self.acked = 0
        self._on_weights = on_weights
        self._current_version = current_version
        self._connector_delta = connector_delta
        self._metadata = bearer_metadata(token)
        self._metrics = metrics
        self.max_spool_bytes = max_spool_bytes
        self._on_room = on_room
        self._queue: list[SingleAgentEpisode] = []
        self._queued = asyncio.Event()
        self._spooled = asyncio.Event()
        self._write_lock = asyncio.Lock()  # one spool writer at a time (seq numbers, stop() vs the writer)
        existing = self.spooled()
        self._next_seq = int(existing[-1].stem) + 1 if existing else 0
        self._sizes = {int(path.stem): path.stat().st_size for path in existing}  # seq -> bytes, unacked
        self.spool_bytes = sum(self._sizes.values())
        metrics.spool_batches.set(len(existing))
        metrics.spool_bytes.set(self.spool_bytes)
        self._tasks: list[asyncio.Task] = []
        options = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]
        self._channel = (
            grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(tls_ca), options=options)
            if tls_ca
            else grpc.aio.insecure_channel(target, options=options)
        )

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.spooled():
            log.info("spool holds %d batches from before: sending them first", len(self.spooled()))
            self._spooled.set()
        self._tasks = [
            loop.create_task(self._write_forever(), name="spool-writer"),
            loop.create_task(self._retry(self._send), name="episode-sender"),
            loop.create_task(self._retry(self._watch), name="weights-watcher"),
        ]

    def ship(self, episodes: list[SingleAgentEpisode]) -> None:
        if episodes:
            self._queue.extend(episodes)
            self._queued.set()

    def full(self) -> bool:
        """The spool holds max_spool_bytes or more: sampling should wait for the learner."""
        return self.spool_bytes >= self.max_spool_bytes

    def spooled(self) -> list[Path]:
        """Batch files not yet acknowledged, oldest first."""
        return sorted(self.spool_dir.glob("*.pb"))

    async def stop(self, flush_timeout_s: float) -> None:
        """Spool what is queued, give the learner up to flush_timeout_s to ack it, then stop."""
        async with self._write_lock:  # a write in flight lands in the spool first; then the rest
            self._add_to_spool(self._write_batch())
        self._spooled.set()  # the sender sends the final batch too
        try:
            async with asyncio.timeout(flush_timeout_s):
                while self.spooled():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            log.warning(
                "learner did not ack %d batches in time: they stay in %s for the next start",
                len(self.spooled()),
                self.spool_dir,
            )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close()

    async def _write_forever(self) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            async with self._write_lock:
                delta = await self._connector_delta()
                self._add_to_spool(await asyncio.to_thread(self._write_batch, delta))
            self._spooled.set()

    def _write_batch(self, connector_delta: dict | None = None) -> tuple[int, Path, int] | None:
        """Everything queued becomes one batch, written to a temporary file: its (seq, file, size), or None
        when nothing was queued. May run on a worker thread; `_add_to_spool` then puts it in the spool.

        The batch carries the connector statistics gathered since the previous one (MeanStdFilter), which
        the learner merges across servers.
        """
        episodes, self._queue = self._queue, []
        if not episodes:
            return None
        seq = self._next_seq
        self._next_seq += 1
        batch = learner_pb2.EpisodeBatch(
            seq=seq,
            server_id=self.server_id,
            episodes=[episode_to_proto(e) for e in episodes],
            connector_state=codec.to_value(connector_delta) if connector_delta else None,
        )
        tmp = self.spool_dir / f"{seq:012d}.tmp"
        data = batch.SerializeToString()
        tmp.write_bytes(data)
        return seq, tmp, len(data)

    def _add_to_spool(self, written: tuple[int, Path, int] | None) -> None:
        """Rename a written batch into the spool (a crash never leaves a torn batch there) and count it.

        On the event loop, like the acks: the sender cannot see the file before it is counted.
        """
        if written is None:
            return
        seq, tmp, size = written
        tmp.replace(tmp.with_suffix(".pb"))
        self._sizes[seq] = size
        self.spool_bytes += size
        self._metrics.spooled_bytes.inc(size)
        self._metrics.spool_batches.inc()
        self._metrics.spool_bytes.set(self.spool_bytes)

    def _acked(self, seq: int, path: Path) -> None:
        """The learner holds batch `seq`: delete its file, and say so when that makes room in the spool."""
        was_full = self.full()
        path.unlink(missing_ok=True)
        self.spool_bytes -= self._sizes.pop(seq, 0)
        self.acked += 1
        self._metrics.acked_batches.inc()
        self._metrics.spool_batches.dec()
        self._metrics.spool_bytes.set(self.spool_bytes)
        if was_full and not self.full():
            self._on_room()

    async def _retry(self, stream: Callable[[], Awaitable[None]]) -> None:
        """Run a stream forever, re-opening it with backoff when it breaks."""
        backoff = 0.05
        while True:
            try:
                await stream()
                backoff = 0.05
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # grpc.aio raises InvalidStateError, not the stream's status, for a write after the stream ended.
                reason = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "ended during a write"
                log.info("learner stream %s ended (%s); retrying in %.2f s", stream.__name__, reason, backoff)
            except Exception:  # never let the link die silently: the spool would only grow
                log.exception("learner stream %s failed; retrying in %.2f s", stream.__name__, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _send(self) -> None:
        """One SubmitEpisodes stream: send every spooled batch in order, delete each on its ack."""
        call = self._channel.stream_stream(
            SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
        )(metadata=self._metadata)
        in_flight: dict[int, Path] = {}
        room = asyncio.Event()
        room.set()

        async def read_acks() -> None:
            async for ack in call:
                path = in_flight.pop(ack.seq, None)
                if path is not None:
                    self._acked(ack.seq, path)
                room.set()

        reader = asyncio.get_running_loop().create_task(read_acks())
        try:
            while True:
                self._spooled.clear()  # before listing: a file written from here on sets it again
                for path in self.spooled():
                    seq = int(path.stem)
                    if seq in in_flight:
                        continue
                    while len(in_flight) >= MAX_IN_FLIGHT:
                        room.clear()
                        await self._first(room.wait(), reader)
                    in_flight[seq] = path
                    await call.write(await asyncio.to_thread(path.read_bytes))
                await self._first(self._spooled.wait(), reader)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            call.cancel()

    @staticmethod
    async def _first(waiting: Awaitable[object], reader: asyncio.Task) -> None:
        """Wait for `waiting`, but raise at once if the ack reader failed (the stream broke)."""
        waiter = asyncio.ensure_future(waiting)
        done, _ = await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if reader in done:
            waiter.cancel()
            reader.result()  # raises the stream's error
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "learner ended the stream")

    async def _watch(self) -> None:
        """One WatchWeights stream: hand every newer version to the server."""
        stub = learner_pb2_grpc.LearnerServiceStub(self._channel)
        request = learner_pb2.WatchWeightsRequest(server_id=self.server_id, after_version=self._current_version())
        async for weights in stub.WatchWeights(request, metadata=self._metadata):
            await self._on_weights(weights)
