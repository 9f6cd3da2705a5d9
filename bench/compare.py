"""Before vs after: two checkouts' servers side by side, under the same loads, measured in one run.

Run: `python -m rlgate.bench.compare OLD_CHECKOUT [NEW_CHECKOUT] --loads 1x1 64x1 16x32 [--rounds 2]`
(NEW defaults to this checkout; make OLD with e.g. `git worktree add /tmp/old <commit>`). Both servers
start together, pinned to the same core; each round measures every load against each server in turn,
in alternating order, so that drift on a shared host hits both alike. The load generators are this
checkout's. Prints one line per measurement and, per load, the median over rounds of NEW / OLD.

`--backends OLD_BACKEND NEW_BACKEND` serves each with its own `rlgate serve --backend` (one checkout may be both:
`python -m rlgate.bench.compare . --backends torch onnxruntime`).

`--handoff` adds B7, the hand-off to a real learner (`bench.handoff`), in the same alternating rounds: each
checkout's own learner and server, started afresh per round, at B7's load. `--loads` with no load measures
the hand-off alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rlgate.bench.handoff import hand_off
from rlgate.bench.main import B7_LOAD, SERVE, SERVE_FED
from rlgate.bench.measure import Load, Timing, under_load
from rlgate.bench.procs import ServerProcess, split_cores

FIGURES = ("env_steps_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_step", "policy_us_per_step")
# The batch stages together (the server's own counters): env_to_module + forward + module_to_env.
POLICY_STAGES = ("env_to_module", "forward", "module_to_env")
HANDOFF = Load(*B7_LOAD)
HANDOFF_FIGURES = ("env_steps_per_s", "p99_ms", "server_cpu_us_per_step", "shipped_per_s", "steps_lost")
Figures = dict[str, dict[str, list[float]]]  # checkout -> figure -> one value per round


def compare(
    checkouts: dict[str, Path],
    loads: list[Load],
    rounds: int,
    timing: Timing,
    backends: dict[str, str] | None = None,
) -> dict[Load, dict]:
    """Per load and figure, each checkout's value in every round; `backends`: each one's `--backend`, if given."""
    server_cores, client_cores = split_cores()
    logs = Path(tempfile.mkdtemp(prefix="rlgate-compare-"))
    servers = {
        name: ServerProcess(
            "rlgate",
            [*SERVE, *(["--backend", backends[name]] if backends else [])],
            server_cores,
            logs / f"{name}.log",
            checkout=checkout,
        )
        for name, checkout in checkouts.items()
    }
    results: dict[Load, dict] = {load: {name: {f: [] for f in FIGURES} for name in servers} for load in loads}
    try:
        for server in servers.values():
            server.wait_serving()
        for r in range(rounds):
            for load in loads:
                for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    measured = under_load(servers[name], load, timing, client_cores, logs)
                    measured["policy_us_per_step"] = sum(measured["stages_us"][s] for s in POLICY_STAGES)
                    for figure in FIGURES:
                        results[load][name][figure].append(measured[figure])
                    figures = ", ".join(f"{f} {measured[f]:,.{3 if f.endswith('_ms') else 0}f}" for f in FIGURES)
                    print(f"round {r + 1} {load.label:>7} {name}: {figures}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return results


def compare_handoff(checkouts: dict[str, Path], rounds: int, timing: Timing) -> Figures:
    """Per checkout and figure, B7's value in every round (each checkout's learner and server, fresh per round)."""
    cores = split_cores()
    logs = Path(tempfile.mkdtemp(prefix="rlgate-compare-handoff-"))
    results: Figures = {name: {f: [] for f in HANDOFF_FIGURES} for name in checkouts}
    for r in range(rounds):
        for name in list(checkouts) if r % 2 == 0 else list(checkouts)[::-1]:
            run_logs = logs / f"{name}-{r + 1}"
            run_logs.mkdir()
            measured = hand_off(HANDOFF, timing, SERVE_FED, cores, run_logs, checkout=checkouts[name])
            for figure in HANDOFF_FIGURES:
                results[name][figure].append(measured[figure])
            figures = ", ".join(f"{f} {measured[f]:,.1f}" for f in HANDOFF_FIGURES)
            print(f"round {r + 1} hand-off {HANDOFF.label} {name}: {figures}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the checkout to compare against (before)")
    parser.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--loads", nargs="*", default=["1x1", "64x1", "16x32", "16x128"], help="CLIENTSxENVS")
    parser.add_argument("--backends", nargs=2, metavar=("OLD", "NEW"), help="each server's rlgate serve --backend")
    parser.add_argument("--handoff", action="store_true", help="also B7, the hand-off to a real learner")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3, help="windows per measurement (their median)")
    args = parser.parse_args()
    loads = [Load(int(clients), int(envs)) for clients, envs in (label.split("x") for label in args.loads)]
    timing = Timing(args.warmup_s, args.window_s, args.repeats)
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    backends = dict(zip(checkouts, args.backends, strict=True)) if args.backends else None
    results = compare(checkouts, loads, args.rounds, timing, backends) if loads else {}
    handoff = compare_handoff(checkouts, args.rounds, timing) if args.handoff else None
    for load, by_name in results.items():
        _print_ratios(load.label, by_name, FIGURES, args.rounds)
    if handoff is not None:
        _print_ratios(f"hand-off {HANDOFF.label}", handoff, HANDOFF_FIGURES[:-1], args.rounds)
        print(f"hand-off env steps lost: old {handoff['old']['steps_lost']}, new {handoff['new']['steps_lost']}")


def _print_ratios(label: str, by_name: Figures, figures: tuple[str, ...], rounds: int) -> None:
    ratios = {f: _ratio(by_name["new"][f], by_name["old"][f]) for f in figures}
    print(f"{label:>7} new/old (median of {rounds} rounds): " + ", ".join(
        f"{f} x{ratio:.2f}" if ratio is not None else f"{f} n/a" for f, ratio in ratios.items()
    ))  # fmt: skip


def _ratio(new: list[float], old: list[float]) -> float | None:
    """The median over rounds of new / old; rounds where old measured 0 (a window with no answer on a starved
    machine) are left out, and None when every round is."""
    ratios = [n / o for n, o in zip(new, old, strict=True) if o > 0]
    return statistics.median(ratios) if ratios else None


if __name__ == "__main__":
    main()
