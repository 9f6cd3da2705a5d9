"""`rlgate up --config` in a user's own project folder, outside the repository: their env (with kwargs), their
ObservationPreprocessor and their learner piece, found by import path in the working directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

RUN = """
[env]
id = "mypkg.corridor:Corridor"
kwargs = { length = 6, max_steps = 30 }
num_envs = 4

[connectors]
env_to_module = [{ type = "mypkg.one_hot:OneHot" }]
learner = [{ type = "mypkg.scale_rewards:ScaleRewards", factor = 2.0 }]

[algorithm]
train_batch_size = 256
minibatch_size = 64
num_epochs = 4
"""


@pytest.mark.slow
def test_a_user_project_trains_its_own_env_and_pieces_through_rlgate_up(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module in ("corridor.py", "one_hot.py", "scale_rewards.py"):
        shutil.copy(EXAMPLES / module, package / module)
    (tmp_path / "run.toml").write_text(RUN)
    command = [sys.executable, "-m", "rlgate", "up", "--config", "run.toml", "--stop-return", "0.3"]
    command += ["--max-steps", "30000", "--run-dir", "runs"]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    logs = {p.name: p.read_text() for p in (tmp_path / "runs").rglob("*.log")}
    assert ran.returncode == 0, ran.stdout[-2000:] + "\n".join(f"{k}:\n{v[-2000:]}" for k, v in logs.items())
    assert "reached return" in ran.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "mypkg.one_hot" in (run_dir / "spec.json").read_text()  # the run spec every process read
