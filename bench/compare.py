"""Before vs after: two checkouts' servers side by side, under the same loads, measured in one run.

Run: `python -m rlgate.bench.compare OLD_CHECKOUT [NEW_CHECKOUT] --loads 1x1 64x1 16x32 [--rounds 2]`
(NEW defaults to this checkout; make OLD with e.g. `git worktree add /tmp/old <commit>`). Both servers
start together, pinned to the same core; each round measures every load against each server in turn,
in alternating order, so that drift on a shared host hits both alike. The load generators are this
checkout's. Prints one line per measurement and, per load, the median over rounds of NEW / OLD.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rlgate.bench.main import SERVE
from rlgate.bench.measure import Load, Timing, under_load
from rlgate.bench.procs import ServerProcess, split_cores

FIGURES = ("env_steps_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_step", "policy_us_per_step")
# The batch stages together (the server's own counters): env_to_module + forward + module_to_env.
POLICY_STAGES = ("env_to_module", "forward", "module_to_env")


def compare(checkouts: dict[str, Path], loads: list[Load], rounds: int, timing: Timing) -> dict[Load, dict]:
    """Per load and figure, each checkout's value in every round."""
    server_cores, client_cores = split_cores()
    logs = Path(tempfile.mkdtemp(prefix="rlgate-compare-"))
    servers = {
        name: ServerProcess("rlgate", SERVE, server_cores, logs / f"{name}.log", checkout=checkout)
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the checkout to compare against (before)")
    parser.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--loads", nargs="+", default=["1x1", "64x1", "16x32", "16x128"], help="CLIENTSxENVS")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3, help="windows per measurement (their median)")
    args = parser.parse_args()
    loads = [Load(*(int(n) for n in label.split("x"))) for label in args.loads]
    timing = Timing(args.warmup_s, args.window_s, args.repeats)
    results = compare({"old": args.old.resolve(), "new": args.new.resolve()}, loads, args.rounds, timing)
    for load, by_name in results.items():
        ratios = {f: _ratio(by_name["new"][f], by_name["old"][f]) for f in FIGURES}
        print(f"{load.label:>7} new/old (median of {args.rounds} rounds): " + ", ".join(
            f"{f} x{ratio:.2f}" if ratio is not None else f"{f} n/a" for f, ratio in ratios.items()
        ))  # fmt: skip


def _ratio(new: list[float], old: list[float]) -> float | None:
    """The median over rounds of new / old; rounds where old measured 0 (a window with no answer on a starved
    machine) are left out, and None when every round is."""
    ratios = [n / o for n, o in zip(new, old, strict=True) if o > 0]
    return statistics.median(ratios) if ratios else None


if __name__ == "__main__":
    main()
