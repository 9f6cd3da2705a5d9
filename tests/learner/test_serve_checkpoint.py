"""`rlgate serve --checkpoint DIR`: a policy the learner trained (PPO, DQN or SAC), served with no learner running."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
from export.test_parity import observations, same_actions, save_checkpoint
from support.servers import RawStream, hello, step, target

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.models import weights_to_bytes
from rlgate.policy import Policy
from rlgate.storage import checkpoint

ENV = "CartPole-v1"


async def test_a_checkpoint_is_served_with_its_version_and_weights(learner_server, server_factory, train_updates):
    learner = learner_server.learner
    acks = await train_updates(learner_server, 2)
    assert [(a.seq, a.duplicates) for a in acks] == [(1, 0), (2, 0)] and all(a.accepted for a in acks)
    path = await learner.save_checkpoint()
    trained = checkpoint.load(path)
    assert trained.version == learner.trainer.version >= 2

    server = await server_factory(checkpoint=path.parent)  # the checkpoint folder, as `--checkpoint DIR`
    assert server.learner is None
    assert weights_to_bytes(server.host.core.module) == trained.weights
    env = gym.make(ENV)
    raw = RawStream(server)
    await raw.send(hello(env.observation_space, env.action_space))
    welcome = (await raw.recv()).welcome
    await raw.send(step(np.zeros((1, 4), np.float32)))
    actions = (await raw.recv()).actions
    await raw.close()
    assert welcome.model_version == actions.model_version == trained.version

    client = EnvClient(env, target(server), seed=3, explore=False)
    stats = await asyncio.wait_for(client.run(max_steps=100), 30)
    assert stats.env_steps >= 100 and stats.model_version == trained.version


@pytest.mark.parametrize(("algo", "env_id"), [("DQN", "CartPole-v1"), ("SAC", "Pendulum-v1")])
async def test_dqn_and_sac_checkpoints_are_served_as_their_policy_acts(tmp_path, server_factory, algo, env_id):
    """A DQN checkpoint's server answers with its module's greedy actions (the argmax of Q, no distribution
    inputs), a SAC one's with tanh of its Gaussian's mean unsquashed to the bounds: what `rlgate.Policy` gives."""
    env = gym.make(env_id)
    spec = {"env": {"id": env_id}, "algorithm": {"name": algo}}
    path = save_checkpoint(tmp_path / "checkpoints", spec, env.observation_space, env.action_space)
    batch = observations(env.observation_space, 16, seed=0)
    expected = Policy.load(path).compute_actions(batch)

    server = await server_factory(checkpoint=path.parent)
    raw = RawStream(server)
    await raw.send(hello(env.observation_space, env.action_space, num_envs=16, explore=False))
    assert (await raw.recv()).welcome.model_version == 7
    await raw.send(step(batch, n=16))
    served = codec.from_tensor((await raw.recv()).actions.actions.tensor)
    await raw.close()
    same_actions(expected, served, env.action_space)
    assert len(np.unique(served, axis=0)) > 1
