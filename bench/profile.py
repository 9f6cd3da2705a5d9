"""Sampling profiles of the bench's processes with py-spy, to say what limits a scenario.

py-spy is not a dependency: `rlgate bench --py-spy PATH [--logs DIR]` uses the executable at PATH.
Each profile is py-spy's raw output (one collapsed stack and its sample count per line), kept in DIR;
`summary` ranks the functions of one by their share of the busy samples.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

_LINE_NUMBER = re.compile(r":\d+\)$")
# Innermost frames of a thread that waits: the event loop in epoll, a thread pool worker on its queue.
WAITS = frozenset({"EpollSelector.select (selectors.py)", "_worker (concurrent/futures/thread.py)"})
# A frame of this repository: "function (package/file.py:line)".
_OURS = re.compile(r"\((?:bench|client|connectors|episodes|learner|models|rlgate|server)/")


def record(py_spy: str, pid: int, seconds: float, output: Path) -> subprocess.Popen:
    """Start sampling `pid` for `seconds` (without pausing it) into `output`; wait on the returned process."""
    command = [py_spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
    command += ["--rate", "250", "--nonblocking", "--format", "raw", "--output", str(output)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summary(profile: Path, count: int = 10) -> dict[str, list[tuple[str, float]]]:
    """The `count` functions with the most busy samples, by two attributions of each sample:

    - `self`: its innermost Python frame (time in C code counts for the Python function that called it);
    - `ours`: its innermost frame in this repository's packages, so library and C time (grpc, torch,
      numpy) counts for our function that called it; the entry point's `main` collects the event loop's
      own work (grpc's callbacks, scheduling).

    Samples of a thread waiting (see WAITS) are left out: py-spy's idle detection misses them here. So are
    lines that are not `stack count`: sampling without pausing the process now and then reads a function
    name while it changes, and the name then holds a newline.
    `Thread.run` as the innermost frame is gRPC's poller thread in native code, waiting or working.
    """
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    for line in profile.read_text(errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():  # a torn read: --nonblocking samples a running process's memory
            continue
        frames = [_LINE_NUMBER.sub(")", frame) for frame in stack.split(";")]
        if frames[-1] in WAITS:
            continue
        own[frames[-1]] += int(samples)
        ours[next((f for f in reversed(frames) if _OURS.search(f)), "(no frame of ours)")] += int(samples)
    total = max(sum(own.values()), 1)
    return {
        kind: [(f, n / total) for f, n in counts.most_common(count)] for kind, counts in (("self", own), ("ours", ours))
    }
