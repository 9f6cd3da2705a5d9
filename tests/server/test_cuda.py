"""The forward pass on a CUDA device gives what the CPU gives (skipped where torch sees no GPU, as in CI)."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.servers import shipped, target

from rlgate.client.env_client import EnvClient
from rlgate.core.columns import Columns
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.spec.run import RunSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ENVS = 8
STEPS = 400


async def greedy_episodes(server_factory, tmp_path, device: str) -> list:
    """Episodes of a greedy 8-env CartPole client against a fresh server on `device` (same seeds each time)."""
    spec = RunSpec.parse({"connectors": {"env_to_module": ["MeanStdFilter"]}}, "test")
    server = await server_factory(spec=spec, device=device, episode_dir=tmp_path / device)
    env = gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync")
    client = EnvClient(env, target(server), explore=False, seed=0)
    stats = await asyncio.wait_for(client.run(max_steps=STEPS), 60)
    assert stats.env_steps >= STEPS
    await server.stop()
    space = env.single_observation_space
    return [episode_from_proto(e, space, env.single_action_space) for e in shipped(tmp_path / device)]


async def test_a_cuda_server_serves_what_a_cpu_server_serves(server_factory, tmp_path):
    cpu = await greedy_episodes(server_factory, tmp_path, "cpu")
    cuda = await greedy_episodes(server_factory, tmp_path, "cuda")
    assert len(cuda) == len(cpu) > ENVS
    for a, b in zip(cpu, cuda, strict=True):
        assert len(a) == len(b)
        np.testing.assert_array_equal(b.get_actions(), a.get_actions())  # greedy: same logits, same actions
        np.testing.assert_allclose(b.get_observations(), a.get_observations(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            b.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS),
            a.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS),
            atol=1e-4,
        )
