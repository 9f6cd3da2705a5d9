"""Local-inference env clients (`EnvClient(..., inference="local")`) against a real server and learner in one event
loop: they act with the weights the server relays, their episodes reach the learner through the server's spool, and
they train it, alone or beside server-side sessions."""

from __future__ import annotations

import gymnasium as gym
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer
from rlgate.server.main import InferenceServer

ENV = "CartPole-v1"


def cartpoles(n: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(n)])


def local_client(server: InferenceServer, tmp_path, n: int = 4, **kwargs) -> EnvClient:
    return EnvClient(cartpoles(n), target(server), inference="local", spool_dir=tmp_path / "client-spool", **kwargs)


async def test_a_local_client_trains_the_learner_through_its_server(
    learner_server: LearnerServer, server_factory, tmp_path
):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    client = local_client(server, tmp_path, seed=0)
    async with running_client(client):
        await until(lambda: server.host.core is not None and server.host.core.version >= 3, timeout=60)
        await until(lambda: client.stats.model_version >= 2, timeout=30)  # it acts with the relayed versions
        assert server.status.status()["local_clients"]["sending_episodes"] == 1
    learner = learner_server.learner
    status = learner.status()
    assert status["model_version"] >= 3 and status["episodes"] > 0
    assert status["stale_steps"] == 0
    assert server.service.env_steps == 0  # no step went through a session: the client acted itself
    assert server.local.env_steps > 0
