"""Measuring one server under one load: warm-up, then fixed windows, then the medians of their figures.

Throughput and round trips come from the clients; CPU from /proc of the server; batch sizes and the
per-stage split from the server's own counters (rlgate only; the bare floor has none). Per env step
figures divide by env steps counted over the same span as the numerator.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlgate.bench import profile
from rlgate.bench.procs import Child, LoadProcess, NodeLoadProcess, ServerProcess
from rlgate.server.metrics import STAGES  # rlgate_stage_seconds_total{stage=...}: CPU time of the thread
from rlgate.service.settings import Backend

# Sleeps through a measuring window of this many seconds; may return figures it watched meanwhile.
Watch = Callable[[float], dict[str, Any]]


@dataclass(frozen=True)
class Load:
    """`clients` env clients with `envs` sub-envs each (rows per message); `spec`: the env of this run spec file
    instead of CartPole."""

    clients: int
    envs: int
    real_envs: bool = False
    spec: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.clients}x{self.envs}"


@dataclass(frozen=True)
class Timing:
    warmup_s: float
    window_s: float
    repeats: int


def figures(steps: int, seconds: float, latency_us: list[int]) -> dict[str, float]:
    """Throughput and round-trip percentiles of one window."""
    latency_ms = np.asarray(latency_us) / 1e3
    p50, p99, p999 = np.percentile(latency_ms, [50, 99, 99.9]) if len(latency_ms) else (0.0, 0.0, 0.0)
    return {"env_steps_per_s": steps / seconds, "p50_ms": p50, "p99_ms": p99, "p999_ms": p999}


def server_figures(before: dict[str, float], after: dict[str, float], cpu_s: float, steps: int) -> dict[str, Any]:
    """Per env step CPU, mean batch and the stage split, from two snapshots of rlgate's metrics.

    `stages_us`: each timed stage's CPU time per env step, plus `untimed`, the server CPU left over (gRPC,
    the event loop, the hand-off to the inference thread). `queue_wait_us`: per message, the server time
    from its arrival to its answer being written that is neither its own stages' CPU time nor its batch's
    compute (wall): waiting behind earlier batches and for the core, the thread hand-offs, the gRPC write.
    Without metrics (the bare floor), only CPU per env step, over the clients' count of env steps.
    """

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    # Its sessions' env steps and its local clients' (which act themselves and send it their episodes).
    server_steps = delta("rlgate_env_steps_total") + delta("rlgate_local_env_steps_total") if after else steps
    per_step_us = 1e6 / max(server_steps, 1)
    result: dict[str, Any] = {"server_cpu_us_per_step": cpu_s * per_step_us}
    if not after:
        return result
    stages = {stage: delta(f"rlgate_stage_seconds_total:{stage}") * per_step_us for stage in STAGES}
    stages["untimed"] = result["server_cpu_us_per_step"] - sum(stages.values())
    messages = max(delta("rlgate_step_latency_seconds_count"), 1)
    batch_s = delta("rlgate_forward_seconds_sum") / max(delta("rlgate_forward_seconds_count"), 1)
    in_handler_s = sum(delta(f"rlgate_stage_seconds_total:{s}") for s in ("decode", "append", "encode")) / messages
    result["mean_batch"] = delta("rlgate_batch_size_sum") / max(delta("rlgate_batch_size_count"), 1)
    result["stages_us"] = stages
    result["queue_wait_us"] = (delta("rlgate_step_latency_seconds_sum") / messages - in_handler_s - batch_s) * 1e6
    return result


# A process using this share of its core (or more) in some window saturates it: that side set the pace.
SATURATED = 0.9


def limited_by(server_cpu: float, client_cpu_peak: float) -> str:
    """Which side limited a point: "load" when a load process used >= SATURATED of its core in some window
    (the steps/s are then the clients', not the server's: compare server CPU per env step instead), else
    "server" when the server did, else "round trip" (neither saturated: each client waits for its answers).
    """
    if client_cpu_peak >= SATURATED:
        return "load"
    if server_cpu >= SATURATED:
        return "server"
    return "round trip"


def medians(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over windows (nested dicts figure by figure)."""
    first = windows[0]
    return {
        key: medians([w[key] for w in windows])
        if isinstance(first[key], dict)
        else statistics.median(w[key] for w in windows)
        for key in first
    }


def sleep(seconds: float) -> dict[str, Any]:
    """The plain `Watch`: nothing to watch."""
    time.sleep(seconds)
    return {}


def under_load(
    server: ServerProcess,
    load: Load,
    timing: Timing,
    client_cores: set[int],
    logs: Path,
    *,
    watch: Watch = sleep,
    py_spy: str | None = None,
    local_spool: Path | None = None,
    local_backend: Backend = "torch",
    node_client: Path | None = None,
) -> dict[str, Any]:
    """Run `load` against `server`: warm up, measure `timing.repeats` windows; the medians, the busiest
    load process's share of its core in the busiest window (`client_cpu_peak`), which side limited the
    point (`limited_by`), and the env steps the clients had answered when they stopped (`total_steps`).

    With `py_spy`, one more window is sampled (server and one client process) into `logs`/profiles and
    summarised under `profile`; its figures are not among the medians. With `local_spool`, the clients act
    themselves (local inference) and spool their episodes there, their forward pass in `local_backend`. With
    `node_client` (clients/node's folder, beside its node_modules), each client is a Node.js process acting itself
    on one env (`NodeLoadProcess`).
    """
    loaders = _loaders(server, load, client_cores, logs, local_spool, local_backend, node_client)
    try:
        for loader in loaders:
            if loader.read_line().strip() != "ready":
                raise loader.failure("load generator did not get ready")
        time.sleep(timing.warmup_s)
        windows = [_window(server, loaders, timing.window_s, watch) for _ in range(timing.repeats)]
        result = medians(windows)
        result["client_cpu_peak"] = max(w["client_cpu"] for w in windows)
        result["limited_by"] = limited_by(result["server_cpu"], result["client_cpu_peak"])
        if py_spy is not None:
            result["profile"] = _profile(server, loaders, timing.window_s, py_spy, logs / "profiles")
        for loader in loaders:
            loader.send("stop")
        result["total_steps"] = sum(loader.read_json()["total_steps"] for loader in loaders)
    finally:
        for loader in loaders:
            loader.stop()
    return result


def _loaders(
    server: ServerProcess,
    load: Load,
    client_cores: set[int],
    logs: Path,
    local_spool: Path | None,
    local_backend: Backend,
    node_client: Path | None,
) -> list[LoadProcess]:
    """The load processes of `load`, its clients shared out among the client cores: one bench.load process per core
    (its clients acting themselves with `local_spool`), or with `node_client` one Node.js process per client."""
    cores = sorted(client_cores)
    shares = [load.clients // len(cores) + (i < load.clients % len(cores)) for i in range(len(cores))]
    if node_client is not None:
        named = [
            (core, f"node-{load.label}-{core}-{i}") for core, n in zip(cores, shares, strict=True) for i in range(n)
        ]
        return [
            NodeLoadProcess(server.target, node_client, {core}, logs / f"load-{name}.log", f"bench-{name}")
            for core, name in named
        ]
    placement = f"local-{local_backend}-" if local_spool is not None else ""
    return [
        LoadProcess(
            server.target,
            n,
            load.envs,
            load.real_envs,
            {core},
            logs / f"load-{placement}{load.label}-{core}.log",
            load.spec,
            local_spool,
            local_backend,
        )
        for core, n in zip(cores, shares, strict=True)
        if n
    ]


def _window(server: ServerProcess, loaders: list[LoadProcess], window_s: float, watch: Watch) -> dict[str, Any]:
    for loader in loaders:
        loader.send("measure")
    for loader in loaders:
        if loader.read_line().strip() != "measuring":
            raise loader.failure("load generator did not start its window")
    before, cpu_before = server.metrics(), server.cpu_seconds()
    watched = watch(window_s)
    for loader in loaders:
        loader.send("report")
    reports = [loader.read_json() for loader in loaders]
    after, cpu_after = server.metrics(), server.cpu_seconds()
    steps = sum(r["steps"] for r in reports)
    seconds = statistics.mean(r["seconds"] for r in reports)
    return {
        **figures(steps, seconds, [us for r in reports for us in r["latency_us"]]),
        **server_figures(before, after, cpu_after - cpu_before, steps),
        "client_cpu": max(r["cpu_s"] / r["seconds"] for r in reports),
        # Protobuf bytes of the step messages and of the answers, per env step (gRPC's framing not counted).
        "bytes_out_per_step": sum(r["bytes_out"] for r in reports) / max(steps, 1),
        "bytes_in_per_step": sum(r["bytes_in"] for r in reports) / max(steps, 1),
        "server_cpu": (cpu_after - cpu_before) / seconds,
        **watched,
    }


def _profile(
    server: ServerProcess, loaders: list[LoadProcess], window_s: float, py_spy: str, directory: Path
) -> dict[str, Any]:
    """Sample the server and the first client process through one window; their summaries by process."""
    directory.mkdir(parents=True, exist_ok=True)
    label = f"{server.log.stem}-{loaders[0].log.stem.removeprefix('load-')}"
    pids = {"server": server.proc.pid, "client": loaders[0].proc.pid}
    outputs = {name: directory / f"{label}-{name}.txt" for name in pids}
    recorders = [profile.record(py_spy, pid, window_s, outputs[name]) for name, pid in pids.items()]
    _window(server, loaders, window_s, sleep)
    for recorder in recorders:
        recorder.wait(window_s + 30)
    return {name: profile.summary(path) for name, path in outputs.items() if path.exists()}


def in_process(envs: list[int], timing: Timing, cores: set[int], logs: Path) -> dict[int, dict[str, float]]:
    """The in-process floor for each number of sub-envs (bench.inprocess in one child pinned to `cores`)."""
    args = ["--envs", *map(str, envs), "--warmup-s", str(timing.warmup_s), "--window-s", str(timing.window_s)]
    args += ["--repeats", str(timing.repeats)]
    child = Child("rlgate.bench.inprocess", args, cores, logs / "inprocess.log", pipes=True)
    windows: dict[int, list[dict[str, float]]] = {n: [] for n in envs}
    try:
        assert child.proc.stdout is not None
        for line in child.proc.stdout:
            report = json.loads(line)
            windows[report["envs"]].append(figures(report["steps"], report["seconds"], report["latency_us"]))
        if child.proc.wait() != 0 or any(len(w) != timing.repeats for w in windows.values()):
            raise child.failure("in-process floor failed")
    finally:
        child.stop()
    return {n: medians(w) for n, w in windows.items()}
