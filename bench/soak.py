"""Soak: many env-client streams against one `rlgate serve` process for a while; no errors, bounded memory.

A real server process (CartPole-v1, no learner) on the first core and `bench.load` processes on the
others keep `--streams` streams of one env each stepping for `--warmup-s`, then `--seconds` more. It
passes when no stream failed, the server rejected nothing and is still up, and its resident memory
(VmRSS from /proc) grew by less than `--max-growth` from the end of the warm-up to the end. Prints one
line, exits 1 on failure.
Run: `python -m rlgate.bench.soak [--streams 256] [--seconds 60]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlgate.bench.main import SERVE
from rlgate.bench.procs import LoadProcess, ServerProcess, split_cores


@dataclass
class SoakResult:
    streams: int
    seconds: float
    env_steps: int  # answered to the clients over the whole run (warm-up included)
    errors: list[str]  # what went wrong, one entry per failure
    rss_start: int  # server VmRSS in bytes after the warm-up
    rss_end: int

    @property
    def growth(self) -> float:
        return self.rss_end / self.rss_start - 1

    def summary(self, max_growth: float) -> str:
        verdict = "ok" if self.passed(max_growth) else "FAILED"
        line = (
            f"soak: {self.streams} streams x {self.seconds:g} s: {self.env_steps} env steps, "
            f"{len(self.errors)} errors, "
            f"server RSS {self.rss_start / 2**20:.1f} -> {self.rss_end / 2**20:.1f} MiB ({self.growth:+.1%}, "
            f"limit {max_growth:+.0%}): {verdict}"
        )
        return "; ".join([line, *self.errors])

    def passed(self, max_growth: float) -> bool:
        return not self.errors and self.growth < max_growth


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def soak(streams: int, seconds: float, warmup_s: float, logs: Path) -> SoakResult:
    """Run the soak; the server and load processes are ended before it returns."""
    server_cores, client_cores = split_cores()
    server = ServerProcess("rlgate", SERVE, server_cores, logs / "server.log")
    loaders: list[LoadProcess] = []
    errors: list[str] = []
    steps = 0
    try:
        server.wait_serving()
        cores = sorted(client_cores)
        shares = [streams // len(cores) + (i < streams % len(cores)) for i in range(len(cores))]
        loaders = [
            LoadProcess(server.target, n, 1, False, {core}, logs / f"load-{core}.log")
            for core, n in zip(cores, shares, strict=True)
            if n
        ]
        for loader in loaders:
            if loader.read_line(timeout=120).strip() != "ready":
                raise loader.failure("load generator did not get ready")
        time.sleep(warmup_s)  # the run itself: streams step meanwhile
        rss_start = rss_bytes(server.proc.pid)
        time.sleep(seconds)
        rss_end = rss_bytes(server.proc.pid)
        for loader in loaders:
            loader.send("stop")
        for loader in loaders:
            try:
                steps += int(loader.read_json()["total_steps"])
            except RuntimeError as exc:  # a stream failed: the load process says which error
                errors.append(str(exc).splitlines()[-1])
        if server.proc.poll() is not None:
            errors.append(f"the server exited with code {server.proc.returncode}")
        else:
            rejected = sum(v for k, v in server.metrics().items() if k.startswith("rlgate_rejected_total:"))
            if rejected:
                errors.append(f"the server rejected {rejected:g} streams (rlgate_rejected_total)")
    finally:
        for loader in loaders:
            loader.stop()
        server.stop()
    return SoakResult(streams, seconds, steps, errors, rss_start, rss_end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256, help="env-client streams (one env each)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they run after the warm-up")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="load before the first memory reading")
    parser.add_argument("--max-growth", type=float, default=0.10, help="largest server RSS growth that passes")
    parser.add_argument("--logs", type=Path, help="folder for the processes' logs (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.streams < 1 or args.seconds <= 0 or args.warmup_s < 0:
        parser.error("--streams must be at least 1, --seconds positive and --warmup-s not negative")
    with tempfile.TemporaryDirectory(prefix="rlgate-soak-") as scratch:
        logs = args.logs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        result = soak(args.streams, args.seconds, args.warmup_s, logs)
    print(result.summary(args.max_growth), flush=True)
    return 0 if result.passed(args.max_growth) else 1


if __name__ == "__main__":
    sys.exit(main())
