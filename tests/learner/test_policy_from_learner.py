"""`Policy.from_learner`: the policy a running learner publishes, in plain Python."""

from __future__ import annotations

import asyncio

import gymnasium as gym

from rlgate import Policy
from rlgate.models import weights_to_bytes


async def test_from_a_running_learner(learner_server, train_updates):
    await train_updates(learner_server, 2)
    target = f"127.0.0.1:{learner_server.port}"
    policy = await asyncio.to_thread(Policy.from_learner, target)
    learner = learner_server.learner
    assert policy.version == learner.trainer.version == 2
    assert weights_to_bytes(policy.module) == weights_to_bytes(learner.trainer.module)
    env = gym.make("CartPole-v1")
    assert env.action_space.contains(policy.compute_action(env.reset(seed=0)[0]))
