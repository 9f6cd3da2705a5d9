"""`python -m rlgate.bench.compare` runs two checkouts' servers side by side; here this checkout against itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlgate.bench.compare import _ratio

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(270)  # the run's own 240 s first (the suite's 120 s would end it earlier, saying less)
def test_compare_measures_both_checkouts_and_prints_ratios() -> None:
    """The old side with the torch backend, the new with onnxruntime (--backends): both serve every load."""
    command = [sys.executable, "-m", "rlgate.bench.compare", str(ROOT), "--loads", "1x1", "2x4", "--rounds", "2"]
    command += ["--backends", "torch", "onnxruntime"]
    command += ["--warmup-s", "0.2", "--window-s", "0.3", "--repeats", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)  # ~25 s alone
    assert done.returncode == 0, done.stderr[-3000:]
    measured = re.findall(r"^round (\d) +(\S+) +(old|new): env_steps_per_s (\S+)", done.stdout, re.M)
    assert len(measured) == 2 * 2 * 2, done.stdout  # rounds x loads x checkouts
    assert all(float(steps.replace(",", "")) > 0 for *_, steps in measured)
    ratios = re.findall(r"^ *(1x1|2x4) new/old \(median of 2 rounds\): env_steps_per_s x(\S+),", done.stdout, re.M)
    assert [load for load, _ in ratios] == ["1x1", "2x4"] and all(float(r) > 0 for _, r in ratios), done.stdout


def test_a_round_whose_old_figure_is_zero_is_left_out_of_the_ratio() -> None:
    assert _ratio([2.0, 3.0, 4.0], [1.0, 0.0, 2.0]) == 2.0
    assert _ratio([1.0], [0.0]) is None


@pytest.mark.slow
@pytest.mark.timeout(330)  # the run's own 300 s first
def test_compare_handoff_runs_each_checkouts_learner_and_server() -> None:
    """`--handoff` alone (no loads): B7 once per checkout, nothing lost, and the ratios printed."""
    command = [sys.executable, "-m", "rlgate.bench.compare", str(ROOT), "--loads", "--handoff", "--rounds", "1"]
    command += ["--warmup-s", "0.5", "--window-s", "0.5", "--repeats", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)  # ~40 s alone
    assert done.returncode == 0, done.stderr[-3000:]
    line = r"^round 1 hand-off 16x32 (old|new): env_steps_per_s (\S+),.* steps_lost (\S+)$"
    measured = re.findall(line, done.stdout, re.M)
    assert sorted(name for name, *_ in measured) == ["new", "old"], done.stdout
    assert all(float(steps.replace(",", "")) > 0 and float(lost) == 0 for _, steps, lost in measured), done.stdout
    assert re.search(r"^hand-off 16x32 new/old \(median of 1 rounds\): env_steps_per_s x\S+,", done.stdout, re.M)
