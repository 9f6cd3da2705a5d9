"""BatchShipper: episode chunks delivered at least once, through an on-disk spool and an acknowledged stream.

`ship()` only queues; a writer task gathers what is queued into one `EpisodeBatch` file in the spool
(`delivery/spool.py`) at most every MIN_WRITE_INTERVAL_S, the chunks' columns joined into one `EpisodeChunks`
table per module, with the connector statistics gathered since the previous batch. `stream(call)` sends every
spooled file over one acknowledged stream (a learner's `SubmitEpisodes`, or a server's for its local-inference
clients), in order, at most MAX_IN_FLIGHT unacknowledged, and hands each ack to `on_ack`, whose owner deletes the
file (`Spool.ack`) and paces itself by it. A broken stream is its owner's to open again: every unacknowledged file
is then sent again, and the receiver drops what it already has (by episode id and chunk index). A batch made
elsewhere (`spool_batch`: a local client's, which its server relays) joins the same spool under this shipper's
sequence numbers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from rlgate.core import codec
from rlgate.delivery.spool import Spool
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.chunk_codec import chunk_tables
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

# Batches sent but not yet acknowledged, at most.
MAX_IN_FLIGHT = 32
# Each batch costs a spool file's writes, a send and an ack whatever it holds: at most one batch per this many
# seconds, holding every chunk shipped meanwhile (at 16 clients x 32 CartPole envs, ~50 chunks, not ~15).
MIN_WRITE_INTERVAL_S = 0.02
# How long a failed write waits for the stream's status to reach the ack reader.
WRITE_FAILED_WAIT_S = 5.0

#: What the stream's owner does with an ack: the spooled file it acknowledges (None: a seq not in flight).
OnAck = Callable[[learner_pb2.EpisodeAck, Path | None], None]


class BatchShipper:
    """Queues chunks, writes them to `spool` as batches signed `sender_id`, streams the spool with acks."""

    def __init__(
        self,
        spool: Spool,
        *,
        sender_id: str,
        connector_delta: Callable[[], Awaitable[dict]],
        on_ack: OnAck,
    ) -> None:
        """`connector_delta()`: the statistics gathered since the last call (taken only with chunks to carry them:
        taken and not sent, they would be lost to the learner while the sender's own view keeps them)."""
        self.spool = spool
        self.sender_id = sender_id
        self._connector_delta = connector_delta
        self._on_ack = on_ack
        self._queue: list[Chunk] = []
        self._queued_steps = 0  # env steps shipped and not yet in the spool
        self._queued = asyncio.Event()
        self._spooled = asyncio.Event()
        self._write_lock = asyncio.Lock()  # one spool writer at a time (seq numbers, drain() vs the writer)
        self._writer: asyncio.Task | None = None

    def start(self) -> None:
        """Start writing what is shipped; what the spool holds from before is sent first."""
        if self.spool.files():
            self._spooled.set()
        self._writer = asyncio.get_running_loop().create_task(self._write_forever(), name="spool-writer")

    def ship(self, chunks: list[Chunk]) -> None:
        if chunks:
            self._queue.extend(chunks)
            self._queued_steps += sum(chunk.steps for chunk in chunks)
            self._queued.set()

    def unacked_steps(self) -> int:
        """Env steps shipped that the receiver has not acknowledged yet (queued or spooled)."""
        return self._queued_steps + self.spool.steps

    async def write_now(self) -> None:
        """Spool what is queued at once, without waiting for MIN_WRITE_INTERVAL_S (the sender waits for its acks)."""
        await self._write_queued()
        self._spooled.set()

    async def spool_batch(self, batch: learner_pb2.EpisodeBatch, steps: int) -> None:
        """A batch of `steps` env steps made elsewhere, into the spool under this shipper's next seq and id; returns
        once it is on disk."""
        async with self._write_lock:
            batch.seq = self.spool.next_seq()
            batch.server_id = self.sender_id
            self._add_to_spool(await asyncio.to_thread(self._write_batch, batch, steps), queued=0)
        self._spooled.set()

    async def drain(self, timeout_s: float, receiver: str) -> None:
        """Spool what is queued and give the receiver up to `timeout_s` to acknowledge the whole spool (the stream
        must be running); what it leaves stays in the spool for the next start, which the log says (naming the
        `receiver`)."""
        await self.write_now()  # after a write in flight; with the statistics gathered since it
        try:
            async with asyncio.timeout(timeout_s):
                while self.spool.files():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            log.warning(
                "%s did not ack %d batches in time: they stay in %s for the next start",
                receiver,
                len(self.spool.files()),
                self.spool.directory,
            )

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)

    async def stream(
        self,
        call: grpc.aio.StreamStreamCall,
        frame: Callable[[bytes], bytes] = bytes,
        until: asyncio.Event | None = None,
        settle_timeout_s: float = 0.0,
    ) -> None:
        """Send every spooled batch over `call` (already open, its own first messages written), in order, and each
        newly spooled one, until the stream breaks (raising its error). `frame`: a spool file's bytes (an
        EpisodeBatch) as the stream's message. Once `until` is set, nothing more is sent: the stream half-closes
        once the batches in flight are acknowledged (waiting at most `settle_timeout_s`: those left unacknowledged
        are sent again on the next stream), and returns."""
        in_flight: dict[int, Path] = {}
        room = asyncio.Event()
        room.set()

        async def read_acks() -> None:
            async for ack in call:
                self._on_ack(ack, in_flight.pop(ack.seq, None))
                room.set()

        reader = asyncio.get_running_loop().create_task(read_acks())
        try:
            while True:
                if until is not None and until.is_set():
                    return await _settle(call, in_flight, room, reader, settle_timeout_s)
                self._spooled.clear()  # before listing: a file written from here on sets it again
                for path in self.spool.files():
                    seq = int(path.stem)
                    if seq in in_flight:
                        continue
                    while len(in_flight) >= MAX_IN_FLIGHT:
                        room.clear()
                        await _first(room.wait(), reader)
                    in_flight[seq] = path
                    data = frame(await asyncio.to_thread(path.read_bytes))
                    try:
                        await call.write(data)
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        # A write after the receiver ended the stream fails with gRPC's own INTERNAL error (or
                        # InvalidStateError), which says nothing of why: the ack reader gets the stream's status,
                        # raised in its place.
                        await _first(asyncio.sleep(WRITE_FAILED_WAIT_S), reader)
                        raise
                await _first(_either(self._spooled, until), reader)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            call.cancel()

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
        """Everything queued, with the connector statistics gathered since the last batch, as one spool batch."""
        async with self._write_lock:
            if self._queue:
                delta = await self._connector_delta()
                chunks, self._queue = self._queue, []  # after the await: what was shipped meanwhile goes too
                # Built here, written on a worker thread: a thread running Python (the tables' columns are joined
                # chunk by chunk) would hold the GIL for up to the 5 ms switch interval whenever the loop wants
                # it, while serializing and writing hand it back within each call.
                batch = self._batch(chunks, delta)
                steps = sum(chunk.steps for chunk in chunks)
                self._add_to_spool(await asyncio.to_thread(self._write_batch, batch, steps), queued=steps)

    def _batch(self, chunks: list[Chunk], connector_delta: dict) -> learner_pb2.EpisodeBatch:
        """The chunks as one batch, with the connector statistics gathered since the previous one (MeanStdFilter),
        which the learner merges across senders."""
        space = chunks[0].observation_space  # what the pipeline's write-backs left (the same for all)
        return learner_pb2.EpisodeBatch(
            seq=self.spool.next_seq(),
            server_id=self.sender_id,
            chunks=chunk_tables([chunk.columns for chunk in chunks]),  # one per module
            connector_state=codec.to_value(connector_delta) if connector_delta else None,
            observation_space=codec.space_to_proto(space) if space is not None else None,
        )

    def _write_batch(self, batch: learner_pb2.EpisodeBatch, steps: int) -> tuple[int, Path, int, int]:
        """The batch written to a temporary file: its (seq, file, size, steps). Runs on a worker thread;
        `_add_to_spool` then puts it in the spool."""
        data = batch.SerializeToString()
        return batch.seq, self.spool.write_tmp(batch.seq, data), len(data), steps

    def _add_to_spool(self, written: tuple[int, Path, int, int], *, queued: int) -> None:
        """On the event loop, like the acks: the stream cannot see the file before it is counted. `queued`: the
        env steps of it that were counted as queued."""
        self.spool.add(*written)
        self._queued_steps -= queued


async def _settle(
    call: grpc.aio.StreamStreamCall, in_flight: dict, acked: asyncio.Event, reader: asyncio.Task, timeout_s: float
) -> None:
    """Wait (at most `timeout_s`) for the acks of the batches in flight, then half-close the stream."""
    try:
        async with asyncio.timeout(timeout_s):
            while in_flight:
                acked.clear()
                await _first(acked.wait(), reader)
    except TimeoutError:
        log.warning(
            "%d batches not acknowledged in %g s: they are sent again on the next stream", len(in_flight), timeout_s
        )
        return
    await call.done_writing()


async def _either(first: asyncio.Event, second: asyncio.Event | None) -> None:
    """Wait until either event is set."""
    if second is None:
        await first.wait()
        return
    waiters = {asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _first(waiting: Awaitable[object], reader: asyncio.Task) -> None:
    """Wait for `waiting`, but raise at once if the ack reader failed (the stream broke)."""
    waiter = asyncio.ensure_future(waiting)
    done, _ = await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
    if reader in done:
        waiter.cancel()
        reader.result()  # raises the stream's error
        empty = grpc.aio.Metadata()
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "the receiver ended the stream")
