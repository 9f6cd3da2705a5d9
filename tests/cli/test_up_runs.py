"""`rlgate up` runs that used to go wrong silently: every update failing, a spec's infinite observations, the
spec's variables (RLGATE_SPEC__*). Each is a real `rlgate up` in a user's project folder, run to its end."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.support import warm

UP_TIMEOUT_S = 180

BOOM = """
from rlgate.connectors import ConnectorV2


class Boom(ConnectorV2):
    def __call__(self, **kwargs):
        raise RuntimeError("this piece is broken")
"""

INF_OBS = """
import gymnasium as gym
import numpy as np


class InfObs(gym.Env):
    \"\"\"Its first observation value is +inf, always: infinity means something here, its Box bound says so.\"\"\"

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([np.inf, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([np.inf, self.t], np.float32), float(action), False, self.t >= 10, {}
"""

NEVER_ENDS = """
import gymnasium as gym
import numpy as np


class NeverEnds(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}
"""


def up(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`rlgate up ARGS` in `cwd`, to its end (forked warm: tests/support/warm.py); (exit status, stdout, stderr).
    Its session (it and its children) is killed if it overruns."""
    return warm.run(["up", "--run-dir", "runs", *args], cwd, UP_TIMEOUT_S, env=env, new_session=True)


@pytest.mark.slow
def test_updates_that_all_fail_stop_the_run_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "pieces.py").write_text(BOOM)
    learner = json.dumps([{"type": "pieces:Boom"}])
    # A return CartPole never pays (500 at most): the failed updates, not 20 random episodes, must end the run.
    args = ("--spec.connectors.learner", learner, "--max-steps", "1000000", "--stop-return", "1000")
    code, out, err = up(tmp_path, *args)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == 1, out + err
    assert err.strip().splitlines()[-1] == (
        f"rlgate: the learner's last 3 updates failed, nothing trains: see {run_dir.relative_to(tmp_path)}/learner.log"
    )
    assert "this piece is broken" in (run_dir / "learner.log").read_text()


@pytest.mark.slow
def test_a_spec_that_allows_infinite_observations_lets_them_through_the_server(tmp_path: Path) -> None:
    (tmp_path / "infobs.py").write_text(INF_OBS)
    args = ("--env", "infobs:InfObs", "--spec.env.allow-nonfinite-obs", "--stop-return", "1000", "--max-steps", "500")
    code, out, err = up(tmp_path, *args)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == 1 and "stopped at return" in out, out + err  # the step budget, not a client refused
    assert "is not finite" not in (run_dir / "envs.log").read_text()


@pytest.mark.slow
def test_a_run_without_a_goal_runs_its_step_budget_and_exits_0(tmp_path: Path) -> None:
    """An env without reward_threshold, no --stop-return, and --max-steps given: the budget is the run (a zero-sum
    game's return is 0 whoever wins), reached as asked, not a goal missed."""
    (tmp_path / "infobs.py").write_text(INF_OBS)  # any env with no reward_threshold
    code, out, err = up(tmp_path, "--env", "infobs:InfObs", "--spec.env.allow-nonfinite-obs", "--max-steps", "500")
    assert code == 0, out + err
    no_preset = "run spec: no preset for infobs:InfObs: what the file and flags leave unset is the spec's default"
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert no_preset in out and no_preset in (run_dir / "learner.log").read_text()  # once each, at start
    assert no_preset in (run_dir / "envs.log").read_text()
    no_goal = "(no --stop-return, and infobs:InfObs has no reward_threshold)"
    assert re.search(
        rf"^ran to --max-steps at return [\d.]+: \d+ env steps in [\d.]+ s {re.escape(no_goal)}$", out, re.M
    )


@pytest.mark.slow
def test_a_run_stopped_before_any_episode_ended_says_so(tmp_path: Path) -> None:
    """Not "return nan": no return was measured."""
    (tmp_path / "never.py").write_text(NEVER_ENDS)
    code, out, err = up(tmp_path, "--env", "never:NeverEnds", "--stop-return", "1", "--max-steps", "300")
    assert code == 1, out + err
    assert re.search(r"^stopped after \d+ env steps in [\d.]+ s, before any episode ended$", out, re.M), out
    assert "nan" not in out, out


@pytest.mark.slow
def test_spec_variables_set_the_run_spec_of_up_and_of_every_process(tmp_path: Path) -> None:
    """RLGATE_SPEC__* as README promises: `up` applies them; the processes run exactly its spec.json."""
    env = {**os.environ, "RLGATE_SPEC__ALGORITHM__LR": "0.0005", "RLGATE_SEED": "7"}
    code, out, err = up(tmp_path, "--stop-return", "1000", "--max-steps", "1500", env=env)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == 1 and "stopped at return" in out, out + err
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["algorithm"]["lr"] == 0.0005 and spec["seed"] == 0  # RLGATE_SEED is not up's (RLGATE_UP_SEED is)
    assert "another run spec" not in (run_dir / "server.log").read_text()
    assert "update version=1 " in (run_dir / "learner.log").read_text()  # the learner trained on the server's steps


@pytest.mark.slow
def test_a_multi_agent_run_takes_prev_actions_prev_rewards_per_agent(tmp_path: Path) -> None:
    """PrevActionsPrevRewards(multi_agent=True) through server, flushes and learner (FlattenObservations after it)."""
    pytest.importorskip("pettingzoo")
    (tmp_path / "examples").symlink_to(Path(__file__).parents[2] / "examples")
    pieces = json.dumps([{"type": "PrevActionsPrevRewards", "multi_agent": True}])
    args = ("--config", "examples/multi_agent_cartpole.toml", "--spec.connectors.env-to-module", pieces)
    code, out, err = up(tmp_path, *args, "--stop-return", "1000", "--max-steps", "3000")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == 1 and "stopped at return" in out, out + err  # the step budget, nothing refused
    for log in ("server.log", "learner.log", "envs.log"):
        assert "Traceback" not in (run_dir / log).read_text(), log


@pytest.mark.slow
def test_a_multi_agent_run_stacks_frames_per_agent_and_learns(tmp_path: Path) -> None:
    """FrameStackingEnvToModule/-Learner(multi_agent=True) through server, intake and learner: the modules take
    stacked frames, the chunks single ones, and PPO learns (a random policy's return is about 22)."""
    pytest.importorskip("pettingzoo")
    (tmp_path / "examples").symlink_to(Path(__file__).parents[2] / "examples")
    stacking = {"multi_agent": True, "num_frames": 4}
    args = (
        *("--config", "examples/multi_agent_cartpole.toml", "--spec.sampling.episode-lookback-horizon", "3"),
        *("--spec.connectors.env-to-module", json.dumps([{"type": "FrameStackingEnvToModule", **stacking}])),
        *("--spec.connectors.learner", json.dumps([{"type": "FrameStackingLearner", **stacking}])),
    )
    code, out, err = up(tmp_path, *args, "--stop-return", "100", "--max-steps", "30000")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert code == 0 and "reached return" in out, out + err
    assert "rejected" not in (run_dir / "learner.log").read_text()  # every chunk decoded in its frames' space
    for log in ("server.log", "learner.log", "envs.log"):
        assert "Traceback" not in (run_dir / log).read_text(), log
