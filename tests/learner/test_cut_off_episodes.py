"""Episodes cut off because their client stopped (it closed its stream, disconnected or was killed) train as
truncated ones but are no finished episodes: the learner's returns and lengths (its status, the live page's
history, progress.csv and TensorBoard, `rlgate up`'s goal) count only episodes their env ended, as RLlib counts
only the episodes its env runners finished. Stopping many clients at a high return dragged the mean down."""

from __future__ import annotations

import gymnasium as gym
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient

ENV = "CartPole-v1"


async def test_episodes_cut_off_as_a_client_stops_train_but_count_in_no_return(learner_server, server_factory):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)]), target(server), seed=0)
    learner = learner_server.learner
    async with running_client(client):  # stopped (cancelled) mid-episode: its stream ends with episodes running
        await until(lambda: learner.trainer.version >= 2 and client.stats.episodes >= 10, timeout=60)
    await server.stop()  # ships the stream's running episodes, truncated, and waits for the learner's acks
    episodes = learner.progress.episodes.page(0)["rows"]
    assert sorted(row["return"] for row in episodes) == sorted(client.stats.returns)
    assert learner.intake.episodes_finished == len(episodes) == client.stats.episodes
    assert list(learner.intake.returns) == [row["return"] for row in episodes][-len(learner.intake.returns) :]
