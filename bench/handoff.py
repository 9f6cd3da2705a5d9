"""B7, the hand-off: episode chunks from the server to the learner, nothing lost, a bounded spool.

A real learner (`rlgate learn`) on the clients' cores and a server shipping to it (`--learner`). The
learner only takes episodes in: its train batch is too large to ever fill and it never checkpoints, so
it keeps every batch it acknowledged in its intake directory, and the hand-off is all that is measured.
During each window: chunks per second shipped by the server's sessions and accepted by the learner,
bytes per second reaching the learner's intake, and the largest server spool (bytes written, not yet
acknowledged). The server's spool is limited to `SPOOL_LIMIT`: when the learner takes chunks in more
slowly than the server ships them, the spool fills up to it and the server then samples at the
learner's pace (the point's `limited_by` then says "learner"). After the run the server is stopped (it
flushes its spool to the learner) and the intake is read back: its chunks, each (episode id, chunk
index) once, must hold every env step the clients were answered.
"""

from __future__ import annotations

import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

from rlgate.bench.measure import Load, Timing, under_load
from rlgate.bench.procs import ServerProcess
from rlgate.v1 import learner_pb2

# Spool samples per second during a window.
SAMPLES_PER_S = 5
# Never reached: the learner stores what it is sent and does not train or checkpoint meanwhile.
NEVER = "1000000000"
# The server's --max-spool: a few seconds of chunks at this load.
SPOOL_LIMIT = 4 << 20


def hand_off(
    load: Load,
    timing: Timing,
    serve: list[str],
    cores: tuple[set[int], set[int]],
    logs: Path,
    checkout: Path | None = None,
) -> dict:
    """B7 under `load`: the medians of each window's figures (with chunks/s shipped and accepted, bytes/s
    and the largest spool), and over the whole run the chunks the learner kept and the env steps missing.
    With `checkout`, the learner and the server are that checkout's (`bench.compare --handoff`)."""
    server_cores, client_cores = cores
    intake, spool = logs / "learner" / "intake", logs / "spool"
    for leftover in (logs / "learner", spool):  # a reused --logs directory: an earlier run's chunks would count
        shutil.rmtree(leftover, ignore_errors=True)
    learn = ["learn", "--env", "CartPole-v1", "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--seed", "0"]
    learn += ["--checkpoint-dir", str(logs / "learner"), "--no-resume"]
    learn += ["--spec.algorithm.train-batch-size", NEVER, "--checkpoint-every", NEVER]
    learner = ServerProcess("rlgate", learn, client_cores, logs / "learner.log", checkout=checkout)
    server = None
    try:
        learner.wait_serving()
        serve = [*serve, "--learner", learner.target, "--spool-dir", str(spool), "--server-id", "bench"]
        serve += ["--max-spool", str(SPOOL_LIMIT)]
        serve += ["--drain-timeout-s", "60"]
        server = ServerProcess("rlgate", serve, server_cores, logs / "rlgate-handoff.log", checkout=checkout)
        server.wait_serving().wait_ready()  # ready: the learner's first weights have arrived
        watch = partial(_watch, server, learner, intake)
        result = under_load(server, load, timing, client_cores, logs, watch=watch)
        server.stop(timeout=90)  # SIGTERM: it sends its whole spool before exiting
        result["unacked_batches"] = len(list((spool / "bench").glob("*.pb")))
    finally:
        if server is not None:
            server.stop()
        learner.stop()
    if result["max_spool_bytes"] >= SPOOL_LIMIT:  # the spool filled (in most windows): the server waited for it
        result["limited_by"] = "learner"
    steps, chunks = _read_back(intake)
    return {**result, "spool_limit_bytes": SPOOL_LIMIT, "chunks": chunks, "steps_lost": result["total_steps"] - steps}


def _watch(server: ServerProcess, learner: ServerProcess, intake: Path, seconds: float) -> dict[str, Any]:
    """Per second over the window: chunks shipped (server) and accepted (learner), bytes reaching the
    intake; and the largest spool sampled in it, in bytes."""
    shipped, accepted, size = _shipped(server), _accepted(learner), _bytes(intake)
    started = time.perf_counter()
    spooled = 0.0
    while (left := started + seconds - time.perf_counter()) > 0:
        time.sleep(min(left, 1 / SAMPLES_PER_S))
        spooled = max(spooled, server.metrics()["rlgate_spool_bytes"])
    elapsed = time.perf_counter() - started
    return {
        "shipped_per_s": (_shipped(server) - shipped) / elapsed,
        "episodes_per_s": (_accepted(learner) - accepted) / elapsed,
        "bytes_per_s": (_bytes(intake) - size) / elapsed,
        "max_spool_bytes": spooled,
    }


def _shipped(server: ServerProcess) -> float:
    """Chunks the server's sessions have shipped so far, however they ended."""
    return sum(v for k, v in server.metrics().items() if k.startswith("rlgate_episodes_total:"))


def _accepted(learner: ServerProcess) -> float:
    """Chunks the learner has taken in so far (new ones and re-sent ones it recognised)."""
    metrics = learner.metrics()
    return metrics["rlgate_learner_episodes_total"] + metrics["rlgate_learner_duplicates_total"]


def _bytes(directory: Path) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.name.endswith(".pb"))


def _read_back(intake: Path) -> tuple[int, int]:
    """Env steps (lookback rows excluded) and the number of distinct chunks in the learner's intake."""
    chunks: dict[tuple[str, int], int] = {}  # (episode id, chunk index) -> steps
    for path in intake.glob("*.pb"):
        batch = learner_pb2.EpisodeBatch.FromString(path.read_bytes())
        for table in batch.chunks:
            chunks.update(zip(zip(table.ids, table.chunk_indices, strict=True), table.steps, strict=True))
        for episode in batch.episodes:  # a server before EpisodeChunks (bench.compare against one)
            chunks[episode.id, episode.chunk_index] = episode.rewards.shape[0] - episode.len_lookback_buffer
    return sum(chunks.values()), len(chunks)
