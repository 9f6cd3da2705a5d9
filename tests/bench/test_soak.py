"""`python -m rlgate.bench.soak`: a real server process under many streams, 0 errors and bounded memory."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rlgate.bench.soak import SoakResult

SUMMARY = re.compile(
    r"^soak: (\d+) streams x (\d+) s: (\d+) env steps, (\d+) errors, "
    r"server RSS ([\d.]+) -> ([\d.]+) MiB \(([+-][\d.]+)%, limit \+10%\): ok$"
)


def run_soak(streams: int, seconds: int, warmup_s: int, timeout: float) -> re.Match:
    command = [sys.executable, "-m", "rlgate.bench.soak", "--streams", str(streams), "--seconds", str(seconds)]
    done = subprocess.run([*command, "--warmup-s", str(warmup_s)], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    found = SUMMARY.match(done.stdout.strip())
    assert found, done.stdout
    assert (int(found[1]), int(found[2]), int(found[4])) == (streams, seconds, 0)
    assert int(found[3]) > streams * seconds  # every stream stepped, many times a second
    return found


@pytest.mark.slow
def test_a_short_soak_passes_with_no_errors():
    run_soak(32, 4, 1, timeout=110)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_256_streams_for_60_s_make_no_errors_and_grow_the_server_by_less_than_10_percent():
    run_soak(256, 60, 10, timeout=280)


@pytest.mark.parametrize(
    ("errors", "rss_end", "passed"),
    [([], 109 << 20, True), ([], 110 << 20, False), (["a stream failed"], 100 << 20, False)],
)
def test_the_verdict_needs_no_errors_and_growth_under_the_limit(errors, rss_end, passed):
    result = SoakResult(streams=2, seconds=1, env_steps=10, errors=errors, rss_start=100 << 20, rss_end=rss_end)
    assert result.passed(0.10) is passed
    assert result.summary(0.10).endswith(("ok" if passed else "FAILED") + "".join(f"; {e}" for e in errors))
