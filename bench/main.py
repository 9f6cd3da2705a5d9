"""`rlgate bench`: a real server and load-generating clients as separate processes on 127.0.0.1.

Scenarios (CartPole-v1, the default 64x64 MLP; the server pinned to the first core, the clients to the
others):
- B1 round trip: 1 client, 1 env per message (the B2 run with K=1);
- B2 concurrency: K clients x 1 env per message;
- B3 vectorised clients: 16 clients x E envs per message;
- B4 breakdown: rlgate's server CPU per env step by stage, for every B2 and B3 load;
- B7 hand-off: episode chunks from the server to a real learner, nothing lost, bounded spool;
- B8 placement: server-side against local inference (the clients act themselves) at 1x1, 4x1, 16x1 and 16x8, both
  while a real learner trains on what they sample (`bench.placement`), with the env steps it trained per second
  beside the clients' (`--num-learners N`: a learner of N data-parallel ranks; `--node-client DIR`: the Node.js
  client acting locally too, at the loads of one env per client, its steps/s over the Python local client's).
`--env ENV` measures that env with its preset instead, beside CartPole-v1 (`bench.envs`).
Every B1-B3 load also runs against two floors: the bare gRPC floor (`bench.floor`, same load) and the
in-process floor (`bench.inprocess`, the same number of sub-envs, no network). Each figure is the
median over windows after a warm-up. `--micro` adds the micro benchmarks (episode codec, connectors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlgate.bench import envs, report
from rlgate.bench.handoff import hand_off
from rlgate.bench.measure import Load, Timing, in_process, under_load
from rlgate.bench.placement import LOADS as PLACEMENT_LOADS
from rlgate.bench.placement import NODE, PLACEMENTS, placements
from rlgate.bench.procs import Child, ServerProcess, host_busy_seconds, own_seconds, split_cores
from rlgate.core.errors import ArgumentParser, UserError

# A server fed by a learner serves the learner's env; a lone one is told its env.
SERVE_FED = ["serve", "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--seed", "0"]
SERVE = [*SERVE_FED, "--env", "CartPole-v1"]
FLOOR = ["--host", "127.0.0.1", "--port", "0"]
# The transport floor runs at the points issue 21's goals are set for (clients, envs per message).
TRANSPORT_POINTS = {(1, 1), (64, 1), (16, 32)}
TRANSPORT = ("env_steps_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_step")
B3_CLIENTS = 16
B7_LOAD = (16, 32)
# Figures every B1-B3 record carries, from rlgate's measurement.
FIGURES: tuple[str, ...] = (
    "env_steps_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "mean_batch",
    "server_cpu_us_per_step",
    "client_cpu",
)
FIGURES += ("server_cpu", "client_cpu_peak", "limited_by")
# Figures of the B7 record, from bench.handoff.
HAND_OFF: tuple[str, ...] = (
    "shipped_per_s",
    "episodes_per_s",
    "bytes_per_s",
    "max_spool_bytes",
    "spool_limit_bytes",
    "unacked_batches",
)
HAND_OFF += ("chunks", "steps_lost")
# Figures of each placement in a B8 record, from bench.placement.
PLACED: tuple[str, ...] = (
    "env_steps_per_s",
    "p50_ms",
    "p99_ms",
    "server_cpu_us_per_step",
    "server_cpu",
    "client_cpu_peak",
)
PLACED += ("limited_by", "trained_per_s", "updates_per_s", "staleness")
MICRO = ("rlgate.bench.episodes_codec", "rlgate.bench.connectors_pipeline")
# Share of one core used outside the bench during a run above which its figures are not to be trusted.
BUSY = 0.1


@dataclass(frozen=True)
class Plan:
    timing: Timing
    clients: tuple[int, ...]  # B2: K
    envs: tuple[int, ...]  # B3: E
    placement: tuple[tuple[int, int], ...]  # B8: (clients, envs per client)


FULL = Plan(
    Timing(warmup_s=2.0, window_s=5.0, repeats=3),
    clients=(1, 4, 16, 64, 256),
    envs=(8, 32, 128),
    placement=PLACEMENT_LOADS,
)
QUICK = Plan(Timing(warmup_s=0.5, window_s=1.0, repeats=1), clients=(1, 64), envs=(32,), placement=((1, 1),))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="rlgate bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer loads, short windows: under a minute")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write one record per measured point here")
    parser.add_argument("--warmup-s", type=float, help="seconds of load before measuring (default by plan)")
    parser.add_argument("--window-s", type=float, help="seconds per measuring window (default by plan)")
    parser.add_argument("--repeats", type=int, help="measuring windows per point; figures are medians")
    parser.add_argument("--real-envs", action="store_true", help="clients step gymnasium's CartPole-v1")
    parser.add_argument(
        "--env",
        metavar="ENV",
        help="instead of B1-B7: ENV with its preset (e.g. ALE/Pong-v5) beside CartPole-v1, at 1x8 and 4x8, real "
        "envs: steps/s, server CPU and bytes per env step",
    )
    parser.add_argument(
        "--num-learners",
        type=int,
        default=1,
        metavar="N",
        help="B8's learner as N data-parallel ranks (`rlgate learn --num-learners N`); default 1",
    )
    parser.add_argument(
        "--placement",
        nargs="+",
        type=_load,
        metavar="KxE",
        help="instead of B1-B7: B8 alone, at these loads (clients x envs each, e.g. 1x1 4x1)",
    )
    parser.add_argument(
        "--node-client",
        type=Path,
        metavar="DIR",
        help="B8 measures the Node.js client acting locally too (clients/node of this checkout, after `npm ci` there: "
        "client.mjs beside its node_modules), at the loads of one env per client",
    )
    parser.add_argument("--micro", action="store_true", help="also run the micro benchmarks")
    parser.add_argument("--py-spy", metavar="PATH", help="profile one more window per point with this py-spy")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep logs and profiles here (default: discarded)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Refuse impossible arguments before the minutes of benchmarking (--json is written only at the end)."""
    if args.warmup_s is not None and not args.warmup_s >= 0:  # NaN fails too
        raise UserError(f"--warmup-s must be at least 0, not {args.warmup_s}")
    if args.window_s is not None and not args.window_s > 0:
        raise UserError(f"--window-s must be more than 0, not {args.window_s}")
    if args.repeats is not None and args.repeats < 1:
        raise UserError(f"--repeats must be at least 1, not {args.repeats}")
    if args.num_learners < 1:
        raise UserError(f"--num-learners must be at least 1, not {args.num_learners}")
    node_client = args.node_client
    if node_client is not None and not (
        (node_client / "client.mjs").is_file() and (node_client / "node_modules").is_dir()
    ):
        raise UserError(
            f"--node-client {node_client}: no client.mjs beside a node_modules (run `npm ci` in clients/node)"
        )
    if node_client is not None and shutil.which("node") is None:
        raise UserError("--node-client: no `node` on PATH")
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        raise UserError(f"--json {args.json}: not a file in an existing directory")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    check_args(args)
    plan = QUICK if args.quick else FULL
    timing = Timing(
        warmup_s=plan.timing.warmup_s if args.warmup_s is None else args.warmup_s,
        window_s=plan.timing.window_s if args.window_s is None else args.window_s,
        repeats=plan.timing.repeats if args.repeats is None else args.repeats,
    )
    started, host_busy, own = time.perf_counter(), host_busy_seconds(), own_seconds()
    with tempfile.TemporaryDirectory(prefix="rlgate-bench-") as scratch:
        logs = args.logs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        profiles: dict[str, Any]
        if args.env:
            records, profiles = envs.run(args.env, timing, logs), {}
        elif args.placement:
            records, profiles = placement_only(args.placement, timing, logs, args.num_learners, args.node_client), {}
        else:
            records, profiles = run(
                plan, timing, args.real_envs, args.py_spy, logs, args.num_learners, args.node_client
            )
        micro = {module: _micro(module, logs) for module in MICRO} if args.micro else {}
    elapsed = time.perf_counter() - started
    others = max(0.0, (host_busy_seconds() - host_busy) - (own_seconds() - own))  # clock ticks: can dip below 0
    if args.env:
        print(report.render_envs(records))
    else:
        print(report.render_placement(records) if args.placement else report.render(records))
    busy = "; the host was busy: rerun" if others > BUSY * elapsed else ""
    print(
        f"\nhost: {os.cpu_count()} cores, run took {elapsed:.0f} s; CPU used outside the bench's processes meanwhile "
        f"(other processes, kernel): {others:.1f} s, {others / elapsed:.0%} of one core{busy}"
    )
    for label, summary in profiles.items():
        print("\n" + report.profiles(label, summary))
    for module, figures in micro.items():
        print(f"\n{module}: {json.dumps(figures)}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def run(
    plan: Plan,
    timing: Timing,
    real_envs: bool,
    py_spy: str | None,
    logs: Path,
    num_learners: int = 1,
    node_client: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measure every point (B8's learner as `num_learners` ranks, with the Node.js client too given `node_client`);
    the records, and the profile summaries by point (with py_spy)."""
    server_cores, client_cores = split_cores()
    loads = [Load(k, 1, real_envs) for k in plan.clients] + [Load(B3_CLIENTS, e, real_envs) for e in plan.envs]
    lone = Load(1, 1, real_envs)  # B1, also B2's K=1
    b7_load = Load(*B7_LOAD, real_envs)
    placed = [Load(clients, envs, real_envs=True) for clients, envs in plan.placement]  # EnvClient steps real envs
    transported = sum((load.clients, load.envs) in TRANSPORT_POINTS for load in loads)
    progress = tqdm(total=2 * len(loads) + transported + 3, desc="rlgate bench", unit="run")
    measured: dict[tuple[str, Load], dict[str, Any]] = {}
    servers = {}
    try:
        servers["rlgate"] = ServerProcess("rlgate", SERVE, server_cores, logs / "rlgate.log")
        servers["floor"] = ServerProcess("rlgate.bench.floor", FLOOR, server_cores, logs / "floor.log")
        transport = [*FLOOR, "--transport-only"]
        servers["transport"] = ServerProcess("rlgate.bench.floor", transport, server_cores, logs / "transport.log")
        for server in servers.values():  # started together, waited for in turn
            server.wait_serving()
        for load in loads:
            # Interleaved, so drift on a shared host hits both alike.
            names = ["rlgate", "floor"]
            names += ["transport"] * ((load.clients, load.envs) in TRANSPORT_POINTS)
            for name in names:
                progress.set_postfix_str(f"{name} {load.label}")
                measured[name, load] = under_load(servers[name], load, timing, client_cores, logs, py_spy=py_spy)
                progress.update()
    finally:
        for server in servers.values():
            server.stop()
    progress.set_postfix_str("in-process floor")
    floors = in_process(sorted({load.clients * load.envs for load in loads}), timing, server_cores, logs)
    progress.update()
    progress.set_postfix_str("hand-off")
    measured["hand-off", b7_load] = hand_off(b7_load, timing, SERVE_FED, (server_cores, client_cores), logs)
    progress.update()
    progress.set_postfix_str("placement")
    if placed:
        cores = (server_cores, client_cores)
        measured.update(placements(placed, timing, SERVE_FED, cores, logs, num_learners, node_client))
    progress.update()
    progress.close()
    profiles = {f"{name} {load.label}": m["profile"] for (name, load), m in measured.items() if "profile" in m}
    records = _records(loads, lone, b7_load, measured, floors) + _placement_records(placed, measured, num_learners)
    return [_rounded(r) for r in records], profiles


def _records(
    loads: list[Load],
    lone: Load,
    b7_load: Load,
    measured: dict[tuple[str, Load], dict[str, Any]],
    floors: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One record per scenario and point: rlgate's figures with those of its floors."""
    records = []
    for load in loads:
        rlgate, floor = measured["rlgate", load], measured["floor", load]
        point = {
            "clients": load.clients,
            "envs_per_message": load.envs,
            **{key: rlgate[key] for key in FIGURES},
            "floor_env_steps_per_s": floor["env_steps_per_s"],
            "floor_p50_ms": floor["p50_ms"],
            "floor_p99_ms": floor["p99_ms"],
            "floor_p999_ms": floor["p999_ms"],
            "floor_server_cpu_us_per_step": floor["server_cpu_us_per_step"],
            "floor_client_cpu": floor["client_cpu"],
            "floor_client_cpu_peak": floor["client_cpu_peak"],
            "floor_server_cpu": floor["server_cpu"],
            "floor_limited_by": floor["limited_by"],
            "inprocess_env_steps_per_s": floors[load.clients * load.envs]["env_steps_per_s"],
        }
        if ("transport", load) in measured:
            point.update({f"transport_{key}": measured["transport", load][key] for key in TRANSPORT})
        if load == lone:
            records.append({"scenario": "B1", **point})
        records.append({"scenario": "B2" if load.envs == 1 else "B3", **point})
        records.append({"scenario": "B4", **point, **{key: rlgate[key] for key in ("stages_us", "queue_wait_us")}})
    b7 = measured["hand-off", b7_load]
    records.append(
        {
            "scenario": "B7",
            "clients": b7_load.clients,
            "envs_per_message": b7_load.envs,
            **{key: b7[key] for key in FIGURES},
            "floor_env_steps_per_s": measured["floor", b7_load]["env_steps_per_s"],
            **{key: b7[key] for key in HAND_OFF},
        }
    )
    return records


def placement_only(
    loads: list[tuple[int, int]], timing: Timing, logs: Path, num_learners: int = 1, node_client: Path | None = None
) -> list[dict[str, Any]]:
    """`--placement`: B8 alone at these (clients, envs per client) loads; its records."""
    placed = [Load(clients, envs, real_envs=True) for clients, envs in loads]
    measured = placements(placed, timing, SERVE_FED, split_cores(), logs, num_learners, node_client)
    return [_rounded(r) for r in _placement_records(placed, measured, num_learners)]


def _load(text: str) -> tuple[int, int]:
    """A load as `--placement` names it: KxE, K clients of E envs each."""
    clients, _, envs = text.partition("x")
    if not (clients.isdigit() and envs.isdigit() and int(clients) > 0 and int(envs) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: write clients x envs each, e.g. 4x1")
    return int(clients), int(envs)


def _placement_records(
    loads: list[Load], measured: dict[tuple[str, Load], dict[str, Any]], num_learners: int
) -> list[dict[str, Any]]:
    """One B8 record per load: each placement's figures, and each local placement's env steps/s over server-side's
    (`local_x_server`, `local_onnxruntime_x_server`, `local_node_x_server`); the Node.js client's, where measured,
    over the Python local client's too (`local_node_x_local`)."""
    records = []
    for load in loads:
        measured_here = [*PLACEMENTS, *[NODE] * ((NODE, load) in measured)]
        placed = {placement: {key: measured[placement, load][key] for key in PLACED} for placement in measured_here}
        server = max(placed["server"]["env_steps_per_s"], 1e-9)
        ratios = {
            f"{placement.replace('-', '_')}_x_server": placed[placement]["env_steps_per_s"] / server
            for placement in measured_here[1:]
        }
        if NODE in placed:
            ratios["local_node_x_local"] = placed[NODE]["env_steps_per_s"] / max(
                placed["local"]["env_steps_per_s"], 1e-9
            )
        records.append(
            {
                "scenario": "B8",
                "clients": load.clients,
                "envs_per_message": load.envs,
                "learners": num_learners,
                **placed,
                **ratios,
            }
        )
    return records


def _micro(module: str, logs: Path) -> dict[str, Any]:
    """A micro benchmark's figures (its `python -m` run, pinned to the server's core)."""
    child = Child(module, [], split_cores()[0], logs / f"{module}.log", pipes=True)
    try:
        assert child.proc.stdout is not None
        output = child.proc.stdout.read()
        if child.proc.wait() != 0:
            raise child.failure(f"{module} failed")
    finally:
        child.stop()
    return json.loads(output)


def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits, through nested dicts."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return float(f"{value:.4g}") if isinstance(value, float) else value
