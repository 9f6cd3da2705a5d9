"""Real env clients against a real server: every observation and action space, many clients at once."""

from __future__ import annotations

import asyncio
import threading

import gymnasium as gym
import numpy as np
import pytest
from support.servers import BOX4, DISCRETE2, SpaceEnv, shipped, target

from rlgate.client.env_client import EnvClient
from rlgate.core.columns import Columns
from rlgate.episodes.chunk_codec import episode_from_proto

OBSERVATION_SPACES = {
    "box": BOX4,
    "discrete": gym.spaces.Discrete(5),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 4]),
    "multi_binary": gym.spaces.MultiBinary(3),
    "dict": gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "mode": gym.spaces.Discrete(3)}),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (3,), np.float32)]),
    # gymnasium's bool Box, as PettingZoo's go_v5 observes its board (was refused at the hello: "numeric dtype").
    "bool_box": gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(np.zeros((5, 5, 3), bool), np.ones((5, 5, 3), bool), dtype=np.bool_),
            "action_mask": gym.spaces.Box(0, 1, (26,), np.int8),
        }
    ),
}
ACTION_SPACES = {
    "discrete": DISCRETE2,
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3]),
    "box": gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 0.5], np.float32)),
}


async def run_to_completion(client: EnvClient, steps: int) -> None:
    stats = await asyncio.wait_for(client.run(max_steps=steps), 30)
    assert stats.env_steps >= steps


@pytest.mark.parametrize("obs_name", OBSERVATION_SPACES)
async def test_every_observation_space_is_served(server_factory, tmp_path, obs_name):
    server = await server_factory()
    env = SpaceEnv(OBSERVATION_SPACES[obs_name], DISCRETE2, length=5)
    client = EnvClient(env, target(server), seed=1)
    await run_to_completion(client, 20)
    assert client.stats.episodes == 4 and list(client.stats.returns) == [5.0] * 4
    await server.stop()
    episodes = shipped(tmp_path / "episodes")
    assert len(episodes) == 4 and all(e.terminated for e in episodes)
    decoded = episode_from_proto(episodes[0], OBSERVATION_SPACES[obs_name], DISCRETE2)
    assert len(decoded) == 5
    assert decoded.get_extra_model_outputs(Columns.ACTION_LOGP).shape == (5,)


@pytest.mark.parametrize("action_name", ACTION_SPACES)
async def test_every_action_space_is_served_inside_its_bounds(server, action_name):
    # SpaceEnv raises on any action outside the space: Box actions must come back unsquashed and clipped.
    client = EnvClient(SpaceEnv(BOX4, ACTION_SPACES[action_name], length=7), target(server), seed=2)
    await run_to_completion(client, 49)
    assert client.stats.episodes == 7


@pytest.mark.parametrize("inference_thread", [False, True])
async def test_many_single_env_clients_and_a_vector_client_share_batches(server_factory, inference_thread):
    # Batches on the event loop (the CPU default) or on a thread of their own (the CUDA default).
    server = await server_factory(inference_thread=inference_thread)
    singles = [EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10), target(server), seed=i) for i in range(4)]
    vector_env = gym.vector.SyncVectorEnv([lambda: SpaceEnv(BOX4, DISCRETE2, length=10) for _ in range(8)])
    vector = EnvClient(vector_env, target(server), seed=100)
    await asyncio.wait_for(asyncio.gather(*(c.run(max_steps=200) for c in singles), vector.run(max_steps=800)), 30)
    assert all(c.stats.episodes == 20 for c in singles)
    assert vector.stats.episodes == 80
    batch = server.metrics.batch_size.collect()[0]
    count = next(s.value for s in batch.samples if s.name.endswith("_count"))
    total = next(s.value for s in batch.samples if s.name.endswith("_sum"))
    assert server.metrics.registry.get_sample_value("rlgate_env_steps_total") == 4 * 200 + 800
    assert total >= 4 * 200 + 800  # every row went through a forward pass (reset observations too)
    assert total / count > 1  # and forward passes were shared between clients
    threads = {t.name.split("_")[0] for t in threading.enumerate()}
    assert ("rlgate-inference" in threads) is inference_thread
