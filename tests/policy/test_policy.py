"""`rlgate.policy.Policy`: a checkpoint's policy in plain Python acts exactly as a server serving it would."""

from __future__ import annotations

import socket
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch
from support.servers import BOX4, DISCRETE2, SpaceEnv

from rlgate import Policy
from rlgate.connectors.env_to_module.mean_std_filter import RunningStats
from rlgate.core.columns import Columns
from rlgate.episodes.session import Session, SessionSpec
from rlgate.models import weights_to_bytes
from rlgate.policy.acting import ActingCore
from rlgate.spec.build import build_policy
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from rlgate.v1 import learner_pb2_grpc

FRAME_STACKING = {
    "connectors": {"env_to_module": [{"type": "FrameStackingEnvToModule", "num_frames": 4}]},
    "sampling": {"episode_lookback_horizon": 3, "rollout_fragment_length": 16},
}
LSTM = {
    "connectors": {"env_to_module": [{"type": "PrevActionsPrevRewards", "n_prev_actions": 1, "n_prev_rewards": 1}]},
    "model": {"config": {"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8}},
    "sampling": {"rollout_fragment_length": 16},
}


def save(
    directory: Path,
    spec: dict[str, Any],
    observation_space: gym.Space = BOX4,
    action_space: gym.Space = DISCRETE2,
    connector_state: dict[str, Any] | None = None,
) -> tuple[Path, RunSpec]:
    """A checkpoint of a fresh model of `spec` (seeded), as a learner writes one."""
    run = RunSpec.model_validate({**spec, "seed": 3})
    built = build_policy(run, observation_space, action_space, ImportPolicy(run.modules()))
    path = checkpoint.save(
        directory,
        version=7,
        spec=run,
        observation_space=observation_space,
        action_space=action_space,
        weights=weights_to_bytes(built.module),
        connector_state=connector_state,
    )
    return path, run


def envs(n: int, length: int = 1000) -> list[SpaceEnv]:
    made = [SpaceEnv(BOX4, DISCRETE2, length=length) for _ in range(n)]
    for i, env in enumerate(made):
        env.reset(seed=i)
    return made


@pytest.mark.parametrize("spec", [FRAME_STACKING, LSTM], ids=["frame-stacking", "lstm"])
def test_actions_match_a_server_serving_the_same_checkpoint(tmp_path, spec, monkeypatch):
    """Two envs, 40 steps (past the server's chunk cuts, and our own episodes' every 10 steps): the Policy's
    action distribution inputs equal the server's step for step, so frame history, previous rewards and the
    LSTM's state are carried as a server carries them."""
    monkeypatch.setattr("rlgate.policy.policy.KEEP_STEPS", 10)
    path, run = save(tmp_path, spec)
    policy = Policy.load(path)
    found = checkpoint.load(path)
    served = ActingCore.build(run, BOX4, DISCRETE2, weights=found.weights)
    session = Session(
        SessionSpec("reference", BOX4, DISCRETE2, 2, explore=False),
        rollout_fragment_length=run.sampling.rollout_fragment_length,
        lookback=run.sampling.episode_lookback_horizon,
    )
    made = envs(2)
    episodes = [policy.new_episode(), policy.new_episode()]
    obs = np.stack([env.observation_space.sample() for env in made])
    rewards = np.zeros(2)
    history_mattered = False
    for _ in range(40):
        rows, _ = session.observe(obs.copy(), rewards, np.zeros(2, bool), np.zeros(2, bool), None)
        reference = served.act(rows, False, obs.copy())
        session.record(reference)
        actions = policy.compute_actions(obs, episodes, rewards=rewards.tolist())
        mine = np.stack([e.last_outputs[Columns.ACTION_DIST_INPUTS] for e in episodes])
        np.testing.assert_allclose(mine, reference[Columns.ACTION_DIST_INPUTS], atol=1e-5)
        assert np.array_equal(actions, reference[Columns.ACTIONS_FOR_ENV])
        history_mattered |= not np.allclose(mine, dist_inputs_without_history(policy, obs), atol=1e-5)
        steps = [env.step(int(a)) for env, a in zip(made, actions, strict=True)]
        obs, rewards = np.stack([s[0] for s in steps]), np.array([s[1] for s in steps])
    assert history_mattered  # a memoryless call computes other inputs: the episodes' history was used
    assert all(len(e.episode) <= 10 for e in episodes)  # memory stays bounded


def dist_inputs_without_history(policy: Policy, obs: np.ndarray) -> np.ndarray:
    fresh = [policy.new_episode() for _ in obs]
    policy.compute_actions(obs, fresh)
    return np.stack([e.last_outputs[Columns.ACTION_DIST_INPUTS] for e in fresh])


def test_one_observation_acts_as_its_row_of_a_batch_and_explore_samples(tmp_path):
    path, _ = save(tmp_path, {})
    policy = Policy.load(path, seed=0)
    batch = np.stack([BOX4.sample() for _ in range(16)])
    greedy = policy.compute_actions(batch)
    assert greedy.shape == (16,) and [policy.compute_action(row) for row in batch] == greedy.tolist()
    single = policy.compute_action(batch[0])
    assert isinstance(single, np.integer) and DISCRETE2.contains(single)

    sampled = [policy.compute_actions(batch, explore=True) for _ in range(20)]
    assert any(not np.array_equal(s, greedy) for s in sampled)  # sampling, not the argmax
    again = Policy.load(path, seed=0)
    assert np.array_equal(
        again.compute_actions(batch, explore=True), Policy.load(path, seed=0).compute_actions(batch, explore=True)
    )


def test_mean_std_filter_statistics_come_from_the_checkpoint_and_stay_put(tmp_path):
    samples = np.random.default_rng(0).normal(3.0, 2.0, size=(500, 4))
    spec = {"connectors": {"env_to_module": ["MeanStdFilter"]}}
    probe = build_policy(RunSpec.model_validate(spec), BOX4, DISCRETE2, ImportPolicy())
    name = probe.env_to_module.connectors[0].name
    stats = RunningStats.of(samples)
    state = {name: {"global": [stats.to_state()], "delta": [RunningStats.zeros((4,)).to_state()]}}
    path, _ = save(tmp_path, spec, connector_state=state)
    policy = Policy.load(path)

    observation = np.array([5.0, -1.0, 3.0, 100.0], np.float32)
    episode = policy.new_episode()
    policy.compute_action(observation, episode)
    normalised = np.clip((observation - stats.mean) / (stats.std + 1e-8), -10, 10).astype(np.float32)
    with torch.inference_mode():
        expected = policy.module.forward_inference({Columns.OBS: torch.from_numpy(normalised[None])})
    np.testing.assert_allclose(
        episode.last_outputs[Columns.ACTION_DIST_INPUTS], expected[Columns.ACTION_DIST_INPUTS][0].numpy(), atol=1e-6
    )
    for _ in range(5):
        policy.compute_actions(np.stack([BOX4.sample() for _ in range(8)]))
    after = policy.env_to_module.get_state()[name]
    assert after["global"][0]["count"] == 500 and after["delta"][0]["count"] == 0  # acting did not move them


def test_code_a_checkpoint_names_is_imported_only_where_allowed(tmp_path, examples_importable):
    path, _ = save(tmp_path, {"model": {"module_class": "examples.tiny_module:TinyActorCritic"}})
    with pytest.raises(SpecError, match="--allow-import examples"):
        Policy.load(path)
    policy = Policy.load(path, allow_import=["examples"])
    assert type(policy.module).__name__ == "TinyActorCritic" and policy.version == 7
    assert DISCRETE2.contains(policy.compute_action(BOX4.sample()))


def test_an_unreachable_learner_is_a_connection_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here
    with pytest.raises(ConnectionError, match=f"learner 127.0.0.1:{port}: DEADLINE_EXCEEDED"):
        Policy.from_learner(f"127.0.0.1:{port}", timeout_s=0.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_policy_on_cuda_acts_as_on_cpu(tmp_path):
    path, _ = save(tmp_path, LSTM)
    cpu, cuda = Policy.load(path), Policy.load(path, device="cuda")
    episodes = {"cpu": [cpu.new_episode() for _ in range(4)], "cuda": [cuda.new_episode() for _ in range(4)]}
    for _ in range(10):
        obs = np.stack([BOX4.sample() for _ in range(4)])
        a = cpu.compute_actions(obs, episodes["cpu"], rewards=[1.0] * 4)
        b = cuda.compute_actions(obs, episodes["cuda"], rewards=[1.0] * 4)
        assert np.array_equal(a, b)
        np.testing.assert_allclose(
            np.stack([e.last_outputs[Columns.ACTION_DIST_INPUTS] for e in episodes["cuda"]]),
            np.stack([e.last_outputs[Columns.ACTION_DIST_INPUTS] for e in episodes["cpu"]]),
            atol=1e-5,
        )


def test_a_multi_agent_run_is_refused_with_a_pointer_to_what_acts_in_one():
    spec = RunSpec.parse({"multi_agent": {}}, "test")
    spaces = gym.spaces.Dict({"a": BOX4}), gym.spaces.Dict({"a": DISCRETE2})
    with pytest.raises(SpecError, match=r"multi-agent run.*use rlgate.MultiAgentPolicy"):
        Policy(spec, *spaces)


def test_a_learner_that_ends_watch_weights_without_weights_is_a_connection_error():
    class Empty(learner_pb2_grpc.LearnerServiceServicer):
        def WatchWeights(self, request, context):
            return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(Empty(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(ConnectionError, match=f"^learner 127.0.0.1:{port}: WatchWeights ended without weights$"):
            Policy.from_learner(f"127.0.0.1:{port}", timeout_s=5)
    finally:
        server.stop(None)
