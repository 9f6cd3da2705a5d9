"""The spool: episode batches waiting for the learner's ack, one file per batch, bounded in bytes.

A batch is the serialized `rlgate.v1.EpisodeBatch` with sequence number `seq`, kept as
`DIR/<seq:012d>.pb` until the learner acknowledges it. Writing happens in two steps so that a crash
never leaves a torn batch in the spool: `write_tmp` (any thread) writes `<seq>.tmp`, `add` (the event
loop) renames it into the spool and counts it. Sequence numbers continue after a restart from the
newest file found; a `.tmp` left by a crash mid-write is deleted then (its batch was never counted as
shipped, and may be torn). Once the spool holds `max_bytes` it is `full()`: its writer (a server, a local-inference
env client) stops sampling until acks make room.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class SpoolMetrics(Protocol):
    """The prometheus metrics a spool keeps current, where its owner exports any (a server's ServerMetrics)."""

    spool_batches: Any
    spool_bytes: Any
    spool_max_bytes: Any
    spooled_bytes: Any
    acked_batches: Any


class Spool:
    """Unacknowledged batch files, their sizes and sequence numbers (no gRPC here)."""

    def __init__(self, directory: Path, *, max_bytes: int, metrics: SpoolMetrics | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.acked = 0  # batches acknowledged since start
        self._metrics = metrics
        for torn in self.directory.glob("*.tmp"):
            log.warning("deleting %s: a batch write that a crash interrupted", torn)
            torn.unlink()
        existing = self.files()
        self._next_seq = int(existing[-1].stem) + 1 if existing else 0
        self._sizes = {int(path.stem): path.stat().st_size for path in existing}  # seq -> bytes, unacked
        self.bytes = sum(self._sizes.values())
        self._steps: dict[int, int] = {}  # seq -> env steps, for batches spooled by this process
        self.steps = 0  # env steps in the spool (those spooled by this process)
        if metrics is not None:
            metrics.spool_max_bytes.set(max_bytes)
        self._export()

    def files(self) -> list[Path]:
        """Batch files not yet acknowledged, oldest first (what is on disk: a batch deleted by hand is not sent)."""
        return sorted(self.directory.glob("*.pb"))

    @property
    def batches(self) -> int:
        """Batches in the spool, not yet acknowledged."""
        return len(self._sizes)

    def full(self) -> bool:
        """The spool holds max_bytes or more: sampling should wait for the learner."""
        return self.bytes >= self.max_bytes

    def next_seq(self) -> int:
        """The sequence number of the next batch (each call takes a new one)."""
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def write_tmp(self, seq: int, data: bytes) -> Path:
        """Write batch `seq` to a temporary file beside the spool (safe on a worker thread)."""
        tmp = self.directory / f"{seq:012d}.tmp"
        tmp.write_bytes(data)
        return tmp

    def add(self, seq: int, tmp: Path, size: int, steps: int) -> None:
        """Rename a written batch of `steps` env steps into the spool and count it (on the event loop, like `ack`)."""
        tmp.replace(tmp.with_suffix(".pb"))
        self._sizes[seq] = size
        self.bytes += size
        self._steps[seq] = steps
        self.steps += steps
        self._export(spooled=size)

    def ack(self, seq: int, path: Path) -> bool:
        """The learner holds batch `seq`: delete its file. True when that took the spool from full to not full."""
        was_full = self.full()
        path.unlink(missing_ok=True)
        self.bytes -= self._sizes.pop(seq, 0)
        self.steps -= self._steps.pop(seq, 0)
        self.acked += 1
        self._export(acked=1)
        return was_full and not self.full()

    def _export(self, *, spooled: int = 0, acked: int = 0) -> None:
        """Bring the metrics (if any) up to date: batches and bytes held, and what was just spooled or acked."""
        metrics = self._metrics
        if metrics is None:
            return
        metrics.spool_batches.set(len(self._sizes))
        metrics.spool_bytes.set(self.bytes)
        if spooled:
            metrics.spooled_bytes.inc(spooled)
        if acked:
            metrics.acked_batches.inc(acked)
