"""The server's link to the learner: episode chunks out (spooled until acknowledged), weights in.

Shipping is at least once: `ship()` only queues; a writer task gathers the chunks into an `EpisodeBatch`
file in the spool (`server/spool.py`), their columns joined into one `EpisodeChunks` table per module; a
sender task streams spool files to `SubmitEpisodes` and deletes each only when its ack arrives. A broken
stream is re-opened with backoff and every unacked file is sent again (the learner drops duplicates by
episode id and chunk index). A server that is killed keeps its spool on disk and sends it after restart;
only chunks still in memory are lost (running episodes, and the chunks of the last `MIN_WRITE_INTERVAL_S`
waiting for the next batch), and `stop()` says how many.

Pacing comes from the learner: its weights say how many shipped env steps a server may hold
unacknowledged (`window`, from `Weights.max_unacked_steps`), and the learner acknowledges only while it
has room for a train batch. Each ack also says how many steps the learner's next update still needs
(`room`); what the server holds beyond that (unacknowledged, or in running episodes: `unshipped()`) would
wait a whole update and train two versions after the weights that sampled it. Once `over_window()` by either
rule, the server pauses sampling (and flushes its running episodes, which fills the learner's batch with the
newest steps); acks bring it back under, and `on_room` is called. The spool is bounded as well: once it
holds `max_spool_bytes`, `full()` is true and sampling pauses the same way. A learner that is down or
slower than the servers therefore stalls the env clients instead of piling up stale data or filling the
disk; what was already accepted still ships, so the limits are overshot by at most the chunks in flight.

While the learner is away, both streams wait for the channel to connect again (gRPC's wait_for_ready),
which tries every quarter second (service/channel.py): the link picks up within about a quarter second of
the learner's return, and logs one line when the learner goes away and one when it is back. `status()` says
where the link stands (connected, last ack, last error, spool fill), as do the rlgate_learner_* metrics.

Every REPORT_EVERY_S the link also tells the learner how this server is doing (`ReportServer`: sessions,
env steps, spool), which the learner's status and page show; the answer names the learner's HTTP port,
so this server's page can link to the learner's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from rlgate.core import codec
from rlgate.episodes.codec import chunk_tables
from rlgate.server.metrics import ServerMetrics
from rlgate.server.shipping import Chunk
from rlgate.server.spool import Spool
from rlgate.service.auth import bearer_metadata
from rlgate.service.channel import CHANNEL_OPTIONS
from rlgate.v1 import learner_pb2, learner_pb2_grpc

log = logging.getLogger(__name__)

SUBMIT = "/rlgate.v1.LearnerService/SubmitEpisodes"
# Batches sent but not yet acknowledged, at most.
MAX_IN_FLIGHT = 32
MAX_BACKOFF_S = 1.0
REPORT_EVERY_S = 1.0
# Each batch costs a spool file's writes, a send and an ack whatever it holds: at most one batch per this many
# seconds, holding every chunk shipped meanwhile (at 16 clients x 32 CartPole envs, ~50 chunks, not ~15).
MIN_WRITE_INTERVAL_S = 0.02


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
        on_weights: Callable[[learner_pb2.Weights], Awaitable[bool]],
        current_version: Callable[[], int],
        connector_delta: Callable[[], Awaitable[dict]],
        metrics: ServerMetrics,
        max_spool_bytes: int,
        on_room: Callable[[], None] = lambda: None,
        unshipped: Callable[[], int] = lambda: 0,
        hold_episodes: bool = False,
        describe: Callable[[], learner_pb2.ServerReport] = learner_pb2.ServerReport,
        token: str | None = None,
        tls_ca: bytes | None = None,
    ) -> None:
        """`on_weights(weights)`: serve a new version; False when the server refuses it (another run spec), and
        then its episodes stay held. `describe()`: this server's report to the learner, less the spool (which the
        link fills in); `unshipped()`: the env steps sampled into running episodes and not shipped yet. With
        `hold_episodes`, nothing is sent until `release_episodes()` (a server sampling with a version 0 of its own,
        until the learner's run spec proves to be the one it was built from)."""
        self.target = target
        self.learner_http_port = 0  # the learner's HTTP port, once a report was answered
        self.spool = Spool(spool_dir, max_bytes=max_spool_bytes, metrics=metrics)
        self.server_id = server_id
        self._on_weights = on_weights
        self._current_version = current_version
        self._connector_delta = connector_delta
        self._metadata = bearer_metadata(token)
        self._on_room = on_room
        self.window = 0  # max unacked env steps, from the learner's weights; 0: no limit
        self.room: int | None = None  # steps the learner's next update still needs, from its last ack
        self._unshipped = unshipped
        self._may_send = asyncio.Event()
        if not hold_episodes:
            self._may_send.set()
        self._queued_steps = 0  # env steps shipped and not yet in the spool
        self._describe = describe
        self._queue: list[Chunk] = []
        self._queued = asyncio.Event()
        self._spooled = asyncio.Event()
        self._write_lock = asyncio.Lock()  # one spool writer at a time (seq numbers, stop() vs the writer)
        self._tasks: list[asyncio.Task] = []
        self._metrics = metrics
        self.state = grpc.ChannelConnectivity.IDLE
        self.connected = False  # the channel is READY
        self._state_since = time.monotonic()
        self._said = ""  # "connected" or "unreachable": the last state change logged
        self.last_ack: float | None = None  # monotonic time of the last ack
        self.last_error: str | None = None  # why the last stream ended, until the learner answers again
        options = [
            ("grpc.max_send_message_length", 256 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
            *CHANNEL_OPTIONS,
        ]
        self._channel = (
            grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(tls_ca), options=options)
            if tls_ca
            else grpc.aio.insecure_channel(target, options=options)
        )

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.spool.files():
            log.info("spool holds %d batches from before: sending them first", len(self.spool.files()))
            self._spooled.set()
        self._tasks = [
            loop.create_task(self._follow_connectivity(), name="learner-connectivity"),
            loop.create_task(self._write_forever(), name="spool-writer"),
            loop.create_task(self._retry(self._send), name="episode-sender"),
            loop.create_task(self._retry(self._watch), name="weights-watcher"),
            loop.create_task(self._report_forever(), name="server-report"),
        ]

    def ship(self, chunks: list[Chunk]) -> None:
        if chunks:
            self._queue.extend(chunks)
            self._queued_steps += sum(chunk.steps for chunk in chunks)
            self._queued.set()

    def release_episodes(self) -> None:
        """Send the spooled episodes (held until now: see `hold_episodes`)."""
        self._may_send.set()

    def learner_page(self) -> str | None:
        """The learner's live page (its host as this server reaches it), once the learner said its HTTP port."""
        if not self.learner_http_port:
            return None
        address = self.target.rpartition("/")[2]  # "dns:///learner:50052" -> "learner:50052"
        return f"http://{address.rpartition(':')[0] or address}:{self.learner_http_port}/"

    def full(self) -> bool:
        """The spool is full: sampling should wait for the learner."""
        return self.spool.full()

    def unacked_steps(self) -> int:
        """Env steps shipped that the learner has not acknowledged yet (queued or spooled)."""
        return self._queued_steps + self.spool.steps

    def over_window(self) -> bool:
        """The learner's pace, sampling should wait: it has not acknowledged `window` env steps yet, or this
        server holds more steps than the learner's next update needs."""
        unacked = self.unacked_steps()
        if 0 < self.window <= unacked:
            return True
        return self.room is not None and unacked + self._unshipped() > self.room

    def away_for(self) -> float | None:
        """Seconds since the learner became unreachable, or None while it is connected."""
        return None if self.connected else time.monotonic() - self._state_since

    def status(self) -> dict[str, Any]:
        """Where the link stands, for the server's /status."""
        now = time.monotonic()
        spool = self.spool
        return {
            "address": self.target,
            "connected": self.connected,
            "state": self.state.name,
            "seconds_in_state": round(now - self._state_since, 1),
            "last_ack_seconds_ago": None if self.last_ack is None else round(now - self.last_ack, 1),
            "last_error": self.last_error,
            "spool_batches": len(spool.files()),
            "spool_bytes": spool.bytes,
            "spool_max_bytes": spool.max_bytes,
            "spool_fill": round(spool.bytes / spool.max_bytes, 4),
            "unacked_steps": self.unacked_steps(),
            "window_steps": self.window,
            "learner_room_steps": self.room,
        }

    async def stop(self, flush_timeout_s: float) -> None:
        """Spool what is queued, give the learner up to flush_timeout_s to ack it, then stop."""
        await self._write_queued()  # after a write in flight; with the statistics gathered since it
        self._spooled.set()  # the sender sends the final batch too
        try:
            async with asyncio.timeout(flush_timeout_s):
                while self.spool.files():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            log.warning(
                "learner did not ack %d batches in time: they stay in %s for the next start",
                len(self.spool.files()),
                self.spool.directory,
            )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close()

    async def _write_forever(self) -> None:
        loop = asyncio.get_running_loop()
        written = -MIN_WRITE_INTERVAL_S
        while True:
            await self._queued.wait()
            await asyncio.sleep(written + MIN_WRITE_INTERVAL_S - loop.time())  # returns at once when negative
            written = loop.time()
            self._queued.clear()
            await self._write_queued()
            self._spooled.set()

    async def _write_queued(self) -> None:
        """Everything queued, with the connector statistics gathered since the last batch, as one spool batch.

        The statistics are taken only with chunks to carry them: taken and not sent, they would be lost to the
        learner while this server's own view keeps them."""
        async with self._write_lock:
            if self._queue:
                delta = await self._connector_delta()
                chunks, self._queue = self._queue, []  # after the await: what was shipped meanwhile goes too
                # Built here, written on a worker thread: a thread running Python (the tables' columns are joined
                # chunk by chunk) would hold the GIL for up to the 5 ms switch interval whenever the loop wants
                # it, while serializing and writing hand it back within each call.
                batch = self._batch(chunks, delta)
                steps = sum(chunk.steps for chunk in chunks)
                self._add_to_spool(await asyncio.to_thread(self._write_batch, batch, steps))

    def _batch(self, chunks: list[Chunk], connector_delta: dict) -> learner_pb2.EpisodeBatch:
        """The chunks as one batch, with the connector statistics gathered since the previous one (MeanStdFilter),
        which the learner merges across servers."""
        space = chunks[0].observation_space  # what the pipeline's write-backs left (the same for all)
        return learner_pb2.EpisodeBatch(
            seq=self.spool.next_seq(),
            server_id=self.server_id,
            chunks=chunk_tables([chunk.columns for chunk in chunks]),  # one per module
            connector_state=codec.to_value(connector_delta) if connector_delta else None,
            observation_space=codec.space_to_proto(space) if space is not None else None,
        )

    def _write_batch(self, batch: learner_pb2.EpisodeBatch, steps: int) -> tuple[int, Path, int, int]:
        """The batch written to a temporary file: its (seq, file, size, steps). Runs on a worker thread;
        `_add_to_spool` then puts it in the spool."""
        data = batch.SerializeToString()
        return batch.seq, self.spool.write_tmp(batch.seq, data), len(data), steps

    def _add_to_spool(self, written: tuple[int, Path, int, int]) -> None:
        """On the event loop, like the acks: the sender cannot see the file before it is counted."""
        self.spool.add(*written)
        self._queued_steps -= written[3]

    async def _follow_connectivity(self) -> None:
        """Keep `state` and `connected` current (and the metric), with one log line per change."""
        state = self._channel.get_state(try_to_connect=True)
        while True:
            connected = state is grpc.ChannelConnectivity.READY
            if connected != self.connected:
                self._state_since = time.monotonic()
                self._metrics.learner_connected.set(connected)
            self.state, self.connected = state, connected
            if connected and self._said != "connected":
                log.info("learner %s: connected", self.target)
                self._said = "connected"
            elif state is grpc.ChannelConnectivity.TRANSIENT_FAILURE and self._said != "unreachable":
                log.warning(
                    "learner %s: unreachable; episodes wait in the spool (%.0f%% of --max-spool full), reconnecting",
                    self.target,
                    100 * self.spool.bytes / self.spool.max_bytes,
                )
                self._said = "unreachable"
            await self._channel.wait_for_state_change(state)
            state = self._channel.get_state()

    async def _retry(self, stream: Callable[[], Awaitable[None]]) -> None:
        """Run a stream forever, re-opening it when it breaks: at once after a stream that had been up a
        while (a learner restart), with growing backoff while it keeps failing (a learner refusing it)."""
        backoff = 0.05
        while True:
            started = time.monotonic()
            try:
                await stream()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # grpc.aio raises InvalidStateError, not the stream's status, for a write after the stream ended.
                if isinstance(exc, grpc.aio.AioRpcError):
                    self.last_error = f"{stream.__name__}: {exc.code().name}: {exc.details()}"
                else:
                    self.last_error = f"{stream.__name__}: ended during a write"
                log.info("learner %s: stream %s; reopening it", self.target, self.last_error)
            except Exception:  # never let the link die silently: the spool would only grow
                self.last_error = f"{stream.__name__}: failed (see the log)"
                log.exception("learner %s: stream %s failed; reopening it", self.target, stream.__name__)
            if time.monotonic() - started > MAX_BACKOFF_S:
                backoff = 0.05
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _send(self) -> None:
        """One SubmitEpisodes stream: send every spooled batch in order, delete each on its ack."""
        await self._may_send.wait()
        call = self._channel.stream_stream(
            SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
        )(metadata=self._metadata, wait_for_ready=True)
        in_flight: dict[int, Path] = {}
        room = asyncio.Event()
        room.set()

        async def read_acks() -> None:
            async for ack in call:
                self._answered()
                path = in_flight.pop(ack.seq, None)
                if path is not None:
                    held = self.full() or self.over_window()
                    self.spool.ack(ack.seq, path)
                    if ack.HasField("room"):
                        self.room = ack.room
                    if held and not (self.full() or self.over_window()):
                        self._on_room()
                room.set()

        reader = asyncio.get_running_loop().create_task(read_acks())
        try:
            while True:
                self._spooled.clear()  # before listing: a file written from here on sets it again
                for path in self.spool.files():
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
            self.room = None  # unknown until the next stream's first ack: meanwhile only the window holds sampling
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
        async for weights in stub.WatchWeights(request, metadata=self._metadata, wait_for_ready=True):
            self.last_error = None
            self.window = weights.max_unacked_steps  # every version says how far sampling may run ahead
            self._on_room()
            if await self._on_weights(weights):
                self.release_episodes()

    def _answered(self) -> None:
        """An ack came: the learner takes our episodes."""
        self.last_ack = time.monotonic()
        self.last_error = None
        self._metrics.learner_last_ack.set_to_current_time()

    async def _report_forever(self) -> None:
        """Tell the learner how this server is doing, every REPORT_EVERY_S, for as long as it runs."""
        stub = learner_pb2_grpc.LearnerServiceStub(self._channel)
        while True:
            report = self._describe()
            report.server_id = self.server_id
            report.spool_batches = self.spool.batches
            report.spool_bytes = self.spool.bytes
            report.max_spool_bytes = self.spool.max_bytes
            try:
                ack = await stub.ReportServer(report, metadata=self._metadata, timeout=5 * REPORT_EVERY_S)
                self.learner_http_port = ack.http_port
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("the learner takes no server reports (an older rlgate): not reporting")
                    return
                self.learner_http_port = 0  # unreachable: no link to its page
            await asyncio.sleep(REPORT_EVERY_S)
