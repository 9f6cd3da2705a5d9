"""`rlgate eval`: a checkpoint's policy run for N episodes in a real env, its returns and lengths, and video."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from export.test_parity import save_checkpoint
from support.checkpoints import multi_agent_checkpoint

from rlgate import MultiAgentPolicy, Policy, evaluate, evaluate_multi_agent
from rlgate.cli.main import main
from rlgate.models import weights_to_bytes
from rlgate.spec.build import build_policy
from rlgate.spec.env import make_agent_envs
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from tests.support import warm

ENV = "CartPole-v1"


@pytest.fixture
def cartpole_checkpoint(tmp_path: Path) -> Path:
    """A checkpoint folder of a (seeded, untrained) CartPole policy, as a learner writes it."""
    spec = RunSpec.model_validate({"env": {"id": ENV}, "seed": 1})
    env = gym.make(ENV)
    built = build_policy(spec, env.observation_space, env.action_space, ImportPolicy())
    checkpoint.save(
        tmp_path / "checkpoints",
        version=5,
        spec=spec,
        observation_space=env.observation_space,
        action_space=env.action_space,
        weights=weights_to_bytes(built.module),
    )
    return tmp_path / "checkpoints"


def rlgate(*args: str) -> subprocess.CompletedProcess[str]:
    """`rlgate ARGS` to its end, forked warm (tests/support/warm.py)."""
    code, out, err = warm.run(list(args), warm.ROOT, 120)
    return subprocess.CompletedProcess(["rlgate", *args], code, out, err)


def test_json_results_are_the_policys_own_episodes(cartpole_checkpoint):
    ran = rlgate("eval", "--checkpoint", str(cartpole_checkpoint), "--episodes", "4", "--seed", "0", "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads(ran.stdout)
    expected = evaluate(Policy.load(cartpole_checkpoint), gym.make(ENV), 4, seed=0)  # greedy: deterministic
    assert results["returns"] == expected.returns and results["lengths"] == expected.lengths
    assert results["episodes"] == 4 and results["version"] == 5 and results["env_id"] == ENV
    summary = expected.summary()
    for key in ("return_mean", "return_std", "return_min", "return_max", "length_mean", "length_max"):
        assert results[key] == pytest.approx(summary[key]), key
    assert results["return_min"] <= results["return_mean"] <= results["return_max"]


@pytest.mark.slow
def test_video_of_every_episode_and_a_readable_report(cartpole_checkpoint, tmp_path):
    videos = tmp_path / "videos"
    ran = rlgate("eval", "--checkpoint", str(cartpole_checkpoint), "--episodes", "2", "--video", str(videos))
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"{ENV}: 2 episodes, greedy actions, checkpoint ")
    assert lines[1].startswith("return  mean ") and lines[2].startswith("length  mean ")
    assert lines[3] == f"videos: {videos}"
    made = sorted(videos.glob("*.mp4"))
    assert len(made) == 2 and all(path.stat().st_size > 1000 for path in made)


@pytest.mark.parametrize(("algo", "env_id"), [("DQN", "CartPole-v1"), ("SAC", "Pendulum-v1")])
def test_dqn_and_sac_checkpoints_play_their_env_as_their_policy(tmp_path, capsys, algo, env_id):
    env = gym.make(env_id)
    spec = {"env": {"id": env_id}, "algorithm": {"name": algo}}
    path = save_checkpoint(tmp_path / "checkpoints", spec, env.observation_space, env.action_space)
    assert main(["eval", "--checkpoint", str(path.parent), "--episodes", "2", "--seed", "0", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    expected = evaluate(Policy.load(path), env, 2, seed=0)  # greedy: deterministic
    assert results["returns"] == pytest.approx(expected.returns) and results["lengths"] == expected.lengths
    assert results["version"] == 7 and results["env_id"] == env_id


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


def test_the_help_says_a_checkpoint_of_your_own_code_needs_allow_import(capsys):
    """Where a user looks first: `rlgate --help`'s line for eval and `rlgate eval --help`'s description."""
    for args, says in (
        (["--help"], "(your own code: --allow-import PKG)"),
        (["eval", "--help"], "needs --allow-import"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 0 and says in " ".join(capsys.readouterr().out.split()), args


def test_user_errors_are_one_line_and_exit_2(cartpole_checkpoint, tmp_path, capsys, monkeypatch):
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 2 and err == [f"rlgate: no checkpoint at {tmp_path / 'nowhere'}: no such directory"]
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(cartpole_checkpoint), "--env", "MountainCar-v0")
    assert code == 2 and len(err) == 1 and "env MountainCar-v0 has observations Box(" in err[0]
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(cartpole_checkpoint), "--episodes", "0")
    assert code == 2 and err == ["rlgate: --episodes must be at least 1, not 0"]

    monkeypatch.setitem(sys.modules, "moviepy", None)  # as without the video extra
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(cartpole_checkpoint), "--video", str(tmp_path))
    assert code == 2 and err == ["rlgate: --video needs moviepy: pip install 'rlgate[video]'"]

    weights = checkpoint.latest(cartpole_checkpoint) / "weights.safetensors"
    weights.write_bytes(b"garbage")
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(cartpole_checkpoint))
    assert code == 2 and err == [
        f"rlgate: checkpoint file {weights} is corrupt: Error while deserializing header: header too small"
    ]


RPS = {"env": {"id": "pettingzoo.classic.rps_v2:parallel_env", "kwargs": {"max_cycles": 5}}, "multi_agent": {}}


def test_a_multi_agent_checkpoint_plays_its_pettingzoo_env_and_reports_each_agent(tmp_path, capsys):
    pytest.importorskip("pettingzoo")
    path, run = multi_agent_checkpoint(tmp_path / "checkpoints", RPS)
    args = ("eval", "--checkpoint", str(path), "--episodes", "3", "--seed", "0", "--allow-import", "pettingzoo")
    ran = rlgate(*args, "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads(ran.stdout)
    policy = MultiAgentPolicy.load(path, allow_import=["pettingzoo"])
    env = make_agent_envs(run.env, ImportPolicy(run.modules()), 1)[0]
    expected = evaluate_multi_agent(policy, env, 3, seed=0)  # greedy: deterministic
    assert results["returns"] == expected.returns and results["lengths"] == [5, 5, 5]
    assert results["agent_return_mean"] == pytest.approx(expected.summary()["agent_return_mean"])
    assert set(results["agent_return_mean"]) == {"player_0", "player_1"} and results["version"] == 4

    assert main(list(args)) == 0  # the report a person reads: a line per agent
    mean = expected.summary()["agent_return_mean"]["player_1"]
    assert f"agent player_1: return mean {mean:.2f}" in capsys.readouterr().out.splitlines()


def test_multi_agent_user_errors_are_one_line(tmp_path, capsys):
    pytest.importorskip("pettingzoo")
    path, _ = multi_agent_checkpoint(tmp_path / "checkpoints", RPS)
    allow = ("--allow-import", "pettingzoo")
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(path))
    assert code == 2 and len(err) == 1 and "--allow-import pettingzoo" in err[0]
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(path), *allow, "--video", str(tmp_path))
    assert code == 2 and err == [
        "rlgate: --video records gymnasium envs: a multi-agent run's PettingZoo env is not recorded"
    ]
    other = "pettingzoo.classic.tictactoe_v3:env"
    code, err = run_in_process(capsys, "eval", "--checkpoint", str(path), *allow, "--env", other)
    assert code == 2 and len(err) == 1
    assert (
        err[0].startswith(f"rlgate: env {other}'s agent 'player_1' has observations Dict(")
        and "the policy in" in err[0]
    )
