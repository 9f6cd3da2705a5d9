"""The warm `rlgate` the CLI tests run commands through (tests/support/warm.py) runs them as `python -m rlgate`
does: the same exit status, stdout and stderr, in the caller's working directory and environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import warm
from tests.support.cli import RLGATE
from tests.support.learners import children


def test_a_warm_run_says_and_exits_as_a_cold_one(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("raise RuntimeError('needs MUJOCO_KEY set')\n")  # found in the working dir
    env = {**os.environ, "RLGATE_MAX_BATCH_SIZE": "0"}
    cases = [
        ["serve"],  # the environment's setting, refused before torch
        ["up", "--env", "mine:Env", "--run-dir", "runs"],  # the user's module, imported from the working directory
        ["eval", "--checkpoint", str(tmp_path / "nothing")],  # refused after torch
        ["episodes", "--help"],  # exit 0, on stdout
        ["up", "--run-dir", str(tmp_path / "mine.py")],  # a SystemExit from `up`
    ]
    for args in cases:
        cold = subprocess.run(
            [*RLGATE, *args],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert warm.run(args, tmp_path, 60, env=env) == (cold.returncode, cold.stdout, cold.stderr), args
        assert cold.returncode == (0 if "--help" in args else 2), cold.stderr


async def test_a_warm_run_past_its_timeout_is_killed() -> None:
    with pytest.raises(TimeoutError):
        await warm.run_async(["serve", "--env", "CartPole-v1", "--port", "0", "--http-port", "0"], Path.cwd(), 2)
    with pytest.raises(TimeoutError):
        warm.run(["serve", "--env", "CartPole-v1", "--port", "0", "--http-port", "0"], Path.cwd(), 2, new_session=True)
    # Killed and reaped: the warm process answered each, so no child of it is left.
    assert not children(warm._warm[0].pid)  # type: ignore[index]
