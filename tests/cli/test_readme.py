"""README.md's five-minute tour runs as written: every block marked `<!-- tour -->`, in order, in a fresh folder.

The commands are copied from the README, not restated here, so a tour that drifts from what rlgate does fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOUR = re.compile(r"<!-- tour -->\n```(sh|python)\n(.*?)```", re.S)


def tour_blocks() -> list[tuple[str, str]]:
    """The README's tour blocks: (language, text), in order."""
    return TOUR.findall((ROOT / "README.md").read_text())


def test_the_readme_has_a_tour_of_shell_and_python() -> None:
    languages = [language for language, _ in tour_blocks()]
    assert "sh" in languages and "python" in languages, languages


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    """From a folder holding the repository's `.venv` and `examples` (as its root does): each shell line exits 0,
    each Python block runs, and the runs leave the checkpoints the later commands read."""
    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RLGATE_")}
    for language, text in tour_blocks():
        commands = [line for line in text.splitlines() if line.strip()] if language == "sh" else [text]
        for command in commands:
            argv = ["bash", "-c", command] if language == "sh" else [sys.executable, "-c", command]
            ran = subprocess.run(
                argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240
            )
            assert ran.returncode == 0, f"{command}\n{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}"
    assert list(tmp_path.glob("runs/cartpole/*/checkpoints/best")), "the tour's CartPole run left no best checkpoint"
    assert list(tmp_path.glob("runs/corridor/*/checkpoints/best"))
