"""The learner on a CUDA device (`rlgate learn --device cuda`) trains as the CPU does, and what it publishes and
checkpoints is the CPU's format: a CPU server serves it, a CPU learner resumes it, and back (two ranks on two GPUs,
NCCL: tests/learner/test_data_parallel.py). Skipped where torch sees no GPU, as in CI: these run on a GPU machine."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import pytest
import torch
from support.learners import ENV
from support.servers import until

from rlgate.learner.learner import Learner
from rlgate.learner.main import LearnerServer
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.trainer import Trainer
from rlgate.models import weights_to_bytes
from rlgate.spec.build import build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from rlgate.storage.checkpoint import optimizer_to_tensors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

OBSERVATION_SPACE = gym.make(ENV).observation_space
ACTION_SPACE = gym.spaces.Discrete(2)
TIMEOUT_S = 60
DEVICES = ("cpu", "cuda")
# Float sums in another order (GPU kernels): the same step to float32 rounding, a few updates on.
TOLERANCE = {"rtol": 1e-4, "abs": 1e-5}
# SAC on CartPole is discrete SAC: expectations over the actions, no sampled noise (CUDA's generator is not the
# CPU's, so a continuous SAC's reparameterised samples differ by device).
OFF_POLICY = {
    "DQN": {"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer"}, "tau": 0.5},
    "SAC": {"tau": 0.5, "initial_alpha": 0.5},
}


def built(spec: RunSpec, device: str) -> tuple[Any, Any]:
    """The spec's seeded module on `device` and its learner pipeline making batches there, as the learner builds
    them."""
    module = build_rl_module(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy()).to(device)
    return module, build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy(), device=device)


def assert_same_update(cpu: dict[str, Any], cuda: dict[str, Any]) -> None:
    """Two updates' stats: the same numbers (its seconds in collectives aside)."""
    assert cpu.keys() == cuda.keys()
    for key, value in cpu.items():
        if isinstance(value, float):
            assert cuda[key] == pytest.approx(value, rel=TOLERANCE["rtol"], abs=TOLERANCE["abs"]), key
        else:
            assert cuda[key] == value, key


def assert_same_weights(cpu: torch.nn.Module, cuda: torch.nn.Module) -> None:
    on_cuda = cuda.state_dict()
    for name, tensor in cpu.state_dict().items():
        assert on_cuda[name].device.type == "cuda", name
        torch.testing.assert_close(on_cuda[name].cpu(), tensor, rtol=TOLERANCE["rtol"], atol=TOLERANCE["abs"])


def test_a_ppo_update_on_cuda_is_the_cpu_update(learner_settings, cartpole_chunks) -> None:
    spec = learner_settings().spec
    trainers = {device: Trainer(*built(spec, device), spec.algorithm, max_staleness=4, seed=0) for device in DEVICES}
    for seed in range(3):
        chunks = cartpole_chunks(128, seed=seed)
        cpu, cuda = trainers["cpu"].update(copy.deepcopy(chunks)), trainers["cuda"].update(chunks)
        assert_same_update(cpu, cuda)
        assert cuda["env_steps"] > 0 and "skipped" not in cuda
    assert_same_weights(trainers["cpu"].module, trainers["cuda"].module)
    for state in trainers["cuda"].optimizer.state.values():
        assert {tensor.device.type for tensor in state.values()} == {"cuda"}


@pytest.mark.parametrize("algorithm", ["DQN", "SAC"])
def test_dqn_and_sac_updates_on_cuda_are_the_cpu_updates(learner_settings, cartpole_chunks, algorithm) -> None:
    fields = {"name": algorithm, "train_batch_size": 64, "training_intensity": 64.0, "broadcast_interval": 2}
    fields |= {"num_steps_sampled_before_learning_starts": 0, "target_network_update_freq": 0, **OFF_POLICY[algorithm]}
    spec = learner_settings(spec={"algorithm": fields, "model": {"config": {"fcnet_hiddens": [32, 32]}}}).spec
    trainers = {device: OffPolicyTrainer(*built(spec, device), spec.algorithm, seed=0) for device in DEVICES}
    for seed in range(3):  # the same seeded buffers sample the same batches
        chunks = cartpole_chunks(64, seed=seed)
        cpu, cuda = trainers["cpu"].update(copy.deepcopy(chunks)), trainers["cuda"].update(chunks)
        assert_same_update(cpu, cuda)
        assert cuda["updates"] == 2 and "skipped" not in cuda
    # The modules, the target networks and SAC's temperature.
    assert_same_weights(trainers["cpu"]._everything(), trainers["cuda"]._everything())
    cpu_buffer, cuda_buffer = trainers["cpu"].buffer.get_state()[0], trainers["cuda"].buffer.get_state()[0]
    for name, array in cpu_buffer.items():  # DQN: priorities from the TD errors
        torch.testing.assert_close(torch.as_tensor(cuda_buffer[name]), torch.as_tensor(array), rtol=1e-4, atol=1e-5)


async def test_what_a_cuda_learner_publishes_a_cpu_server_serves(
    learner_settings, train_updates, server_factory
) -> None:
    server = LearnerServer(learner_settings(device="cuda"))
    await server.start()
    try:
        learner = server.learner
        assert learner.device.type == "cuda" and next(learner.trainer.module.parameters()).is_cuda
        await train_updates(server, 2)
        await until(lambda: learner.weights.version == 2, 10)
        published = learner.weights.safetensors
        assert published == weights_to_bytes(learner.trainer.module)
        path = await learner.save_checkpoint()
    finally:
        await server.stop()
    cpu_server = await server_factory(checkpoint=path.parent, device="cpu")
    module = cpu_server.host.core.module
    assert next(module.parameters()).device.type == "cpu"
    assert weights_to_bytes(module) == checkpoint.load(path).weights == published


@pytest.mark.parametrize("algorithm", ["PPO", "DQN", "SAC"])
def test_checkpoints_go_from_a_gpu_to_a_cpu_and_back(learner_settings, cartpole_chunks, tmp_path, algorithm) -> None:
    """A checkpoint a cuda learner wrote resumes on a cpu learner with its weights and optimizer state, and the
    cpu learner's checkpoint resumes on cuda again: the files are the device's business of neither."""
    spec = None
    if algorithm != "PPO":
        fields = {"name": algorithm, "train_batch_size": 64, "num_steps_sampled_before_learning_starts": 0}
        spec = {"algorithm": fields}
    trained = {}
    for device in ("cuda", "cpu", "cuda"):
        learner = Learner(learner_settings(spec=spec, device=device, checkpoint_dir=tmp_path / "checkpoints"))
        assert learner.device.type == device
        if trained:  # resumed: the last device's version, weights and learner state
            assert (learner.trainer.version, weights_to_bytes(learner.trainer.module)) == trained["weights"]
            assert state_bytes(learner) == trained["state"]
        learner.trainer.update(cartpole_chunks(128, seed=len(trained)))
        learner._write_checkpoint(learner.intake.checkpoint_state(), None)
        trained = {"weights": (learner.trainer.version, weights_to_bytes(learner.trainer.module))}
        trained["state"] = state_bytes(learner)


def state_bytes(learner: Learner) -> dict[str, bytes]:
    """The learner's optimizer and learner-side networks' state as a checkpoint writes it (CPU bytes by name)."""
    trainer = learner.trainer
    if isinstance(trainer, OffPolicyTrainer):
        tensors = trainer.state()[0]
    else:
        tensors = optimizer_to_tensors(trainer.optimizer)[0]
    return {name: tensor.numpy().tobytes() for name, tensor in tensors.items()}
