"""The policy in your engine: a CartPole written in JavaScript (clients/node) plays 100 episodes with a policy
`rlgate up` trained, exported with `rlgate export --explore` and loaded in-process with onnxruntime-node: no
server runs, and sampling as the server samples, the mean return is at least 475 (CartPole-v1's solved
threshold). Acting greedily from the same file, it reaches at least half of that file's greedy mean in Python."""

from __future__ import annotations

import gymnasium as gym
import pytest
from cli.test_up_runs import up
from server.test_node_client import client_output, node_client, run_client  # noqa: F401 (node_client: the fixture)
from support.cli import rlgate

from rlgate.policy import Policy
from rlgate.policy.evaluate import evaluate


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_node_cartpole_solves_the_task_in_process_with_the_exported_policy(tmp_path, node_client):  # noqa: F811
    # The stop's mean is of the last 20 episodes the clients sampled, so the 475 is asked of sampled play: a
    # greedy policy can be worse than the policy it comes from (one stopped at 500 averaged 370.9 over 100 greedy
    # episodes in CI; one that ran to 100k env steps 440 in gymnasium, and 496 sampling).
    code, out, err = up(tmp_path, "--env", "CartPole-v1", "--seed", "0", "--stop-return", "500")
    assert code == 0, out + err
    (checkpoints,) = (tmp_path / "runs").glob("*/checkpoints")
    file = tmp_path / "cartpole.onnx"
    code, stderr = await rlgate("export", "--checkpoint", str(checkpoints), "--output", str(file), "--explore")
    assert code == 0, stderr

    # No server: the port is never used.
    play = ("--mode", "in-process", "--model", str(file), "--episodes", "100")
    sampled = await run_client(node_client, 1, *play, "--explore")
    assert sampled["episodes"] == 100 and len(sampled["returns"]) == 100
    assert sampled["model_version"] >= 1
    assert sampled["mean_return"] >= 475, sampled["returns"]

    # Greedy, the same file in Python (gymnasium's CartPole) as the yardstick: a JavaScript path that got the
    # observations or the greedy noise wrong plays about as a random policy does (~22), far below half of it.
    greedy = await run_client(node_client, 1, *play)
    python = evaluate(Policy.load(file), gym.make("CartPole-v1"), 50, seed=0).summary()
    assert len(greedy["returns"]) == 100 and all(1 <= r <= 500 for r in greedy["returns"])
    assert greedy["mean_return"] >= 0.5 * python["return_mean"], (greedy["returns"], python)

    # A file that cannot sample, asked to: one line, exit 1.
    plain = tmp_path / "greedy.onnx"
    code, stderr = await rlgate("export", "--checkpoint", str(checkpoints), "--output", str(plain))
    assert code == 0, stderr
    code, _, said = await client_output(node_client, 1, "--mode", "in-process", "--model", str(plain), "--explore")
    assert code == 1 and said.strip() == f"client.mjs: --explore needs a file exported with --explore: {plain}"
