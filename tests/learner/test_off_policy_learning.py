"""DQN and SAC through the wire: a real learner, inference server and env client on 127.0.0.1. The replay ratio
and the learner's room pace sampling, epsilon reaches the servers with the weights, checkpoints keep every
optimizer, target network, alpha and counter (and the replay buffer where the spec says so), and a checkpoint
acts as its module does in `rlgate.Policy` and `rlgate serve --checkpoint`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load as load_safetensors
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.core.columns import Columns
from rlgate.learner.main import LearnerServer
from rlgate.models import weights_to_bytes
from rlgate.policy import Policy
from rlgate.storage import checkpoint

SMALL = {"model": {"config": {"fcnet_hiddens": [32], "fcnet_activation": "relu"}}}
DQN = {
    **SMALL,
    "algorithm": {
        "name": "DQN",
        "train_batch_size": 32,
        "training_intensity": 16.0,  # an update per 2 env steps
        "num_steps_sampled_before_learning_starts": 64,
        "broadcast_interval": 8,
        "epsilon": [[0, 1.0], [400, 0.2]],
        "target_network_update_freq": 32,
        "store_buffer_in_checkpoints": True,
    },
    "sampling": {"rollout_fragment_length": 8},
    "env": {"id": "CartPole-v1", "num_envs": 2},
}
SAC = {
    **SMALL,
    "algorithm": {
        "name": "SAC",
        "train_batch_size": 32,
        "training_intensity": 32.0,
        "num_steps_sampled_before_learning_starts": 32,
        "broadcast_interval": 8,
    },
    "sampling": {"rollout_fragment_length": 8},
    "env": {"id": "Pendulum-v1", "num_envs": 2},
}


@pytest.fixture(autouse=True)
def one_thread():
    """The learner's updates on one thread, as `rlgate up` runs them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


async def train(learner_settings, server_factory, spec: dict, versions: int) -> tuple[LearnerServer, object]:
    """A learner with `spec` fed by a server and a client of 2 sub-envs until it published `versions` versions;
    the learner is left running (the caller stops it)."""
    learner_server = LearnerServer(learner_settings(env=None, spec=spec, preset="none"))
    await learner_server.start()
    learner = learner_server.learner
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    env = gym.vector.SyncVectorEnv([lambda: gym.make(spec["env"]["id"])] * 2)
    window = learner.off_policy_window()
    highest = 0.0  # the most env steps the learner held past those its updates were done for
    async with running_client(EnvClient(env, target(server), seed=0)):

        def check() -> bool:
            nonlocal highest
            highest = max(highest, learner.env_steps_received() - learner.trainer.steps_trained_for())
            core = server.host.core
            return learner.trainer.version >= versions and core is not None and core.version >= 2

        await until(check, timeout=240)
    # Pacing: never more than two calls' worth of steps ahead of the updates, plus what one batch brings past it
    # (a chunk per sub-env) and the forward pass under way when the server paused (a step per sub-env: 50 against
    # 48 was seen on a loaded machine).
    assert highest <= 2 * window + 2 * spec["sampling"]["rollout_fragment_length"] + 2
    return learner_server, server


async def test_dqn_trains_through_the_wire_at_its_replay_ratio_and_servers_explore_with_its_epsilon(
    learner_settings, server_factory
):
    learner_server, server = await train(learner_settings, server_factory, DQN, versions=6)
    learner, trainer = learner_server.learner, learner_server.learner.trainer
    try:
        # The epsilon the learner set at its last published version is what the server's module explores with:
        # the published weights' (the trainer's own may be the next version's, an update under way).
        await until(lambda: server.host.core.version == learner.weights.version, timeout=30)
        published = load_safetensors(learner.weights.safetensors)["epsilon"]
        assert float(server.host.core.module.epsilon) == pytest.approx(float(published))
    finally:
        await learner_server.stop()
    config = learner.spec.algorithm
    rows = learner.progress.updates.page(0)["rows"]
    # A version a row each (the last may still have been training when the learner stopped: its row never came).
    assert [row["version"] for row in rows] == list(range(1, len(rows) + 1)) and len(rows) >= trainer.version - 1
    assert all(1 <= row["updates"] <= config.broadcast_interval for row in rows)
    assert sum(row["updates"] for row in rows) == rows[-1]["updates_total"] <= trainer.updates
    assert trainer.updates == int((trainer.env_steps - 64) / 2) - trainer.owed_updates()  # 16 / 32: one per 2 steps
    assert len(trainer.buffer) == trainer.env_steps and rows[-1]["buffer_size"] <= trainer.env_steps
    assert rows[-1]["replay_ratio"] == pytest.approx(32 * rows[-1]["updates_total"] / rows[-1]["env_steps"])
    assert all(np.isfinite(row["qf_loss"]) and np.isfinite(row["td_error_mean"]) for row in rows)
    assert float(trainer.module.epsilon) == pytest.approx(max(0.2, 1.0 - 0.8 * trainer.env_steps / 400), abs=0.05)


async def test_a_dqn_checkpoint_resumes_every_part_of_training_and_acts_as_the_module(learner_settings, server_factory):
    learner_server, _ = await train(learner_settings, server_factory, DQN, versions=3)
    await learner_server.stop()  # its final checkpoint
    trained = learner_server.learner.trainer
    found = checkpoint.load(learner_server.learner.settings.checkpoint_dir)
    assert found.learner_state is not None and found.replay_buffer is not None  # store_buffer_in_checkpoints
    resumed = LearnerServer(learner_settings(env=None, spec=DQN, preset="none"))  # resumes from the same directory
    resumed.learner.progress.close()  # never started: only its state is looked at
    trainer = resumed.learner.trainer
    counters = ("version", "env_steps", "updates", "replayed", "last_target_update")
    assert [getattr(trainer, name) for name in counters] == [getattr(trained, name) for name in counters]
    assert weights_to_bytes(trainer.learner.target) == weights_to_bytes(trained.learner.target)
    ours, theirs = trainer.learner.optimizers["qf"].state_dict(), trained.learner.optimizers["qf"].state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for key, state in ours["state"].items():
        assert all(torch.equal(state[name], theirs["state"][key][name]) for name in ("exp_avg", "exp_avg_sq", "step"))
    assert len(trainer.buffer) == len(trained.buffer) and list(trainer.buffer.episodes) == list(trained.buffer.episodes)

    policy = Policy.load(found.directory)
    observations = np.random.default_rng(0).uniform(-0.2, 0.2, (16, 4)).astype(np.float32)
    with torch.inference_mode():
        greedy = trained.module.compute_q_values({Columns.OBS: torch.from_numpy(observations)}).argmax(-1)
    assert policy.compute_actions(observations).tolist() == greedy.tolist()


async def test_sac_trains_through_the_wire_and_its_checkpoint_acts_within_the_bounds(learner_settings, server_factory):
    learner_server, _ = await train(learner_settings, server_factory, SAC, versions=4)
    await learner_server.stop()
    trained = learner_server.learner.trainer
    row = learner_server.learner.progress.updates.page(0)["rows"][-1]
    assert all(np.isfinite(row[key]) for key in ("qf_loss", "qf_twin_loss", "policy_loss", "alpha_loss", "alpha"))
    found = checkpoint.load(learner_server.learner.settings.checkpoint_dir)
    assert found.replay_buffer is None  # store_buffer_in_checkpoints is off by default
    resumed_learner = LearnerServer(learner_settings(env=None, spec=SAC, preset="none")).learner
    resumed_learner.progress.close()  # never started: only its state is looked at
    resumed = resumed_learner.trainer
    alpha = resumed.learner.temperature.log_alpha.detach()
    assert torch.equal(alpha, trained.learner.temperature.log_alpha.detach()) and float(alpha) != 0.0
    assert resumed.learner.optimizers["alpha"].state_dict()["state"][0]["step"] == trained.updates
    assert len(resumed.buffer) == 0

    policy = Policy.load(found.directory)
    observations = np.random.default_rng(1).uniform(-1, 1, (16, 3)).astype(np.float32)
    actions = policy.compute_actions(observations)
    with torch.inference_mode():
        logits = trained.module.forward_inference({Columns.OBS: torch.from_numpy(observations)})
        mean = logits[Columns.ACTION_DIST_INPUTS].chunk(2, -1)[0]
    np.testing.assert_allclose(actions, 2.0 * np.tanh(mean.numpy()), rtol=1e-5)  # squashed, then Pendulum's bounds
    sampled = policy.compute_actions(observations, explore=True)
    assert np.abs(sampled).max() <= 2.0 and not np.allclose(sampled, actions)
