"""The server's link to the learner: episode chunks out (spooled until acknowledged), weights in.

Shipping is at least once, through a `BatchShipper` (`delivery/shipper.py`): `ship()` only queues; a writer task
gathers the chunks into an `EpisodeBatch` file in the spool (`delivery/spool.py`), their columns joined into one
`EpisodeChunks` table per module; the sender streams spool files to `SubmitEpisodes` and deletes each only when its
ack arrives. Batches of the server's local-inference clients (`spool_batch`) join the same spool. A broken stream
is re-opened with backoff and every unacked file is sent again (the learner drops duplicates by episode id and
chunk index). A server that is killed keeps its spool on disk and sends it after restart; only chunks still in
memory are lost (running episodes, and the chunks of the last `MIN_WRITE_INTERVAL_S` waiting for the next batch),
and `stop()` says how many.

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

from rlgate.delivery.shipper import BatchShipper
from rlgate.delivery.spool import Spool
from rlgate.episodes.chunk import Chunk
from rlgate.server.metrics import ServerMetrics
from rlgate.service.auth import bearer_metadata
from rlgate.service.channel import CHANNEL_OPTIONS
from rlgate.v1 import learner_pb2, learner_pb2_grpc

log = logging.getLogger(__name__)

SUBMIT = "/rlgate.v1.LearnerService/SubmitEpisodes"
MAX_BACKOFF_S = 1.0
REPORT_EVERY_S = 1.0


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
        self.shipper = BatchShipper(
            self.spool, sender_id=server_id, connector_delta=connector_delta, on_ack=self._acked
        )
        self.server_id = server_id
        self._on_weights = on_weights
        self._current_version = current_version
        self._metadata = bearer_metadata(token)
        self._on_room = on_room
        self.window = 0  # max unacked env steps, from the learner's weights; 0: no limit
        self.room: int | None = None  # steps the learner's next update still needs, from its last ack
        self.room_version: int | None = None  # the weights version that room is for (the ack's `version`)
        self._weights_seen = -1  # the newest version the learner sent, once the server took it (or refused it)
        self._unshipped = unshipped
        self._may_send = asyncio.Event()
        if not hold_episodes:
            self._may_send.set()
        self._describe = describe
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
        self.shipper.start()
        self._tasks = [
            loop.create_task(self._follow_connectivity(), name="learner-connectivity"),
            loop.create_task(self._retry(self._send), name="episode-sender"),
            loop.create_task(self._retry(self._watch), name="weights-watcher"),
            loop.create_task(self._report_forever(), name="server-report"),
        ]

    def ship(self, chunks: list[Chunk]) -> None:
        self.shipper.ship(chunks)

    async def spool_batch(self, batch: learner_pb2.EpisodeBatch, steps: int) -> None:
        """A local-inference client's batch of `steps` env steps, into the spool (returns once it is on disk)."""
        await self.shipper.spool_batch(batch, steps)

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
        return self.shipper.unacked_steps()

    def over_window(self) -> bool:
        """The learner's pace, sampling should wait: it has not acknowledged `window` env steps yet, or this
        server holds more steps than the learner's next update needs."""
        unacked = self.unacked_steps()
        if 0 < self.window <= unacked:
            return True
        if self.room is None:
            return False
        return self.behind() or unacked + self._unshipped() > self.room

    def behind(self) -> bool:
        """The learner's last ack made room for a weights version that has not reached this server yet: sampling
        waits for it (the ack came before the weights it follows). A version the server refused counts as reached:
        it sends the learner nothing meanwhile."""
        if self.room_version is None:
            return False
        return max(self._current_version(), self._weights_seen) < self.room_version

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
        await self.shipper.drain(flush_timeout_s, "learner")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.shipper.stop()
        await self._channel.close()

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
        try:
            await self.shipper.stream(call)
        finally:
            held = self.over_window()
            self.room = self.room_version = None  # unknown until the next stream's first ack: meanwhile only the
            # window holds sampling
            if held and not self.over_window():  # the room held sampling: it may go on (the learner may be gone)
                self._on_room()

    def _acked(self, ack: learner_pb2.EpisodeAck, path: Path | None) -> None:
        """An ack of the learner's: delete the batch file, take its room, and wake sampling if that made room."""
        self._answered()
        if path is None:
            return
        held = self.full() or self.over_window()
        self.spool.ack(ack.seq, path)
        if ack.HasField("room"):
            self.room = ack.room
            self.room_version = ack.version if ack.HasField("version") else None
        if held and not (self.full() or self.over_window()):
            self._on_room()

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
            self._weights_seen = max(self._weights_seen, weights.version)
            if self.room_version is not None:  # the version a held ack's room was for may be here now
                self._on_room()

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
