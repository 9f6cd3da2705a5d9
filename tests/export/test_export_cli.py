"""`rlgate export` as a real process: checkpoints `rlgate up` trained (Pendulum, CartPole) export to files that
act as the checkpoint's Policy acts; one module of a multi-agent run per file; every mistake one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from cli.test_up_runs import up
from export.test_parity import draw_noise, save_checkpoint
from support.checkpoints import multi_agent_checkpoint
from support.cli import rlgate

from rlgate import MultiAgentPolicy, OnnxPolicy, Policy
from rlgate.export.contract import CONTRACT_KEY

ROOT = Path(__file__).resolve().parents[2]


def one_user_error(code: int, stderr: str) -> str:
    assert code == 2 and "Traceback" not in stderr, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith("rlgate: "), stderr
    return line.removeprefix("rlgate: ")


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
async def test_a_checkpoint_rlgate_up_trained_exports_to_a_file_that_acts_as_its_policy(tmp_path, env_id):
    small = ("--spec.algorithm.train-batch-size", "256", "--spec.sampling.rollout-fragment-length", "64")
    code, out, err = up(tmp_path, "--env", env_id, *small, "--max-steps", "1500", "--stop-return", "100000")
    assert code == 1 and "stopped at return" in out, out + err  # the step budget
    (checkpoints,) = (tmp_path / "runs").glob("*/checkpoints")
    policy = Policy.load(checkpoints)
    assert policy.version >= 1  # trained, not version 0
    for explore in (False, True):
        file = tmp_path / f"policy-{explore}.onnx"
        args = ["export", "--checkpoint", str(checkpoints), "--output", str(file)] + ["--explore"] * explore
        code, stderr = await rlgate(*args)
        assert code == 0, stderr
        exported = OnnxPolicy.load(file)
        assert exported.version == policy.version and exported.contract["explore"] is explore
        space = policy.observation_space
        space.seed(0)
        batch = np.stack([space.sample() for _ in range(1000)])
        if explore:
            noise = draw_noise(exported.noise_kind, (1000, *exported.noise.shape[1:]), seed=1)
            torch.manual_seed(1)  # the torch path draws the same noise
            expected = policy.compute_actions(batch, explore=True)
            actions = exported.compute_actions(batch, explore=True, noise=noise)
        else:
            expected, actions = policy.compute_actions(batch), exported.compute_actions(batch)
        if env_id == "Pendulum-v1":
            np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5)
        else:
            np.testing.assert_array_equal(actions, expected)


@pytest.mark.usefixtures("examples_importable")
@pytest.mark.slow
async def test_a_multi_agent_run_exports_one_file_per_module(tmp_path):
    spec = {
        "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole", "kwargs": {"num_agents": 2}},
        "multi_agent": {"policy_mapping_fn": "per_agent"},
        "connectors": {"env_to_module": [{"type": "MeanStdFilter", "multi_agent": True}]},
    }
    path, _ = multi_agent_checkpoint(tmp_path / "ckpt", spec)
    policy = MultiAgentPolicy.load(path, allow_import=["examples"])
    rng = np.random.default_rng(0)
    observations = rng.normal(0.0, 0.5, (200, 2, 4)).astype(np.float32)
    expected = [policy.compute_actions({"agent_0": o[0], "agent_1": o[1]}) for o in observations]
    for i, agent in enumerate(("agent_0", "agent_1")):
        file = tmp_path / f"{agent}.onnx"
        code, stderr = await rlgate(
            "export", "--checkpoint", str(path), "--output", str(file), "--module", agent, "--allow-import", "examples"
        )
        assert code == 0, stderr
        exported = OnnxPolicy.load(file)
        assert exported.contract["module_id"] == agent
        actions = exported.compute_actions(observations[:, i])
        np.testing.assert_array_equal(actions, [int(e[agent]) for e in expected])


@pytest.mark.slow
@pytest.mark.usefixtures("examples_importable")
async def test_each_mistake_is_one_line_and_exit_2(tmp_path):
    single = save_checkpoint(tmp_path / "single", {}, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    multi, _ = multi_agent_checkpoint(
        tmp_path / "multi",
        {
            "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole", "kwargs": {"num_agents": 2}},
            "multi_agent": {"policy_mapping_fn": "per_agent"},
        },
    )
    user_piece = save_checkpoint(
        tmp_path / "user-piece",
        {"connectors": {"env_to_module": [{"type": "examples.one_hot:OneHot"}]}},
        gym.spaces.Discrete(5),
        gym.spaces.Discrete(2),
    )
    out = str(tmp_path / "out.onnx")
    cases = {
        ("--checkpoint", str(tmp_path / "nowhere"), "--output", out): f"no checkpoint at {tmp_path / 'nowhere'}: "
        "no such directory",
        ("--checkpoint", str(multi), "--output", out, "--module", "nobody", "--allow-import", "examples"): (
            f"the checkpoint in {multi} has modules agent_0, agent_1: no module 'nobody' in it"
        ),
        ("--checkpoint", str(multi), "--output", out, "--allow-import", "examples"): (
            f"the checkpoint in {multi} has modules agent_0, agent_1: choose one with --module"
        ),
        ("--checkpoint", str(single), "--output", out, "--module", "main"): (
            f"--module main: the checkpoint in {single} is single-agent (its one module is 'default_policy')"
        ),
        ("--checkpoint", str(single), "--output", str(tmp_path / "no-dir" / "p.onnx")): (
            f"--output {tmp_path / 'no-dir' / 'p.onnx'}: {tmp_path / 'no-dir'} is not a directory this user may "
            "write in"
        ),
        ("--checkpoint", str(single), "--output", str(tmp_path)): (
            f"--output {tmp_path} is a directory: name the .onnx file to write"
        ),
        ("--checkpoint", str(user_piece), "--output", out, "--allow-import", "examples"): (
            "connectors.env_to_module[0]: OneHot cannot be folded into an ONNX graph (rlgate folds "
            "FlattenObservations, FrameStacking, MeanStdFilter, PrevActionsPrevRewards): export the module alone "
            "with --module-only and do what the piece does in your engine"
        ),
    }
    for args, said in cases.items():
        assert one_user_error(*await rlgate("export", *args)) == said, args
    assert not Path(out).exists()
    # --module-only takes the user's piece's output (the module's observations) as its input.
    code, stderr = await rlgate(
        "export", "--checkpoint", str(user_piece), "--output", out, "--allow-import", "examples", "--module-only"
    )
    assert code == 0, stderr
    exported = OnnxPolicy.load(out)
    assert exported.contract["module_only"] and exported.observation_space == gym.spaces.Box(0.0, 1.0, (5,))
    assert CONTRACT_KEY == "rlgate.contract"
