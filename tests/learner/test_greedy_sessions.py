"""A greedy client (explore=False: the proto3 default) is served and recorded, never trained on."""

from __future__ import annotations

import gymnasium as gym
from support.learners import intake_chunks
from support.servers import running_client, shipped, target, until

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer

ENV = "CartPole-v1"


async def test_a_greedy_clients_episodes_go_to_the_episode_files_but_never_to_the_learner(
    learner_settings, server_factory, tmp_path
):
    """Its actions carry no log-probabilities, and every update that batched one of its chunks used to fail."""
    learner_server = LearnerServer(learner_settings(spec={"algorithm": {"train_batch_size": 256}}))
    await learner_server.start()
    learner = learner_server.learner
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
        greedy = EnvClient(gym.make(ENV), target(server), seed=1, client_id="greedy", explore=False)
        exploring = EnvClient(gym.make(ENV), target(server), seed=2, client_id="exploring")
        async with running_client(greedy), running_client(exploring):
            await until(lambda: learner.trainer.version >= 3, timeout=60)
            sessions = {session.spec.client_id: session.id for session in server.service.sessions.values()}
        await server.stop()  # ships the running episodes' steps, then stops
    finally:
        await learner_server.stop()
    registry = learner.metrics.registry
    assert registry.get_sample_value("rlgate_learner_failed_updates_total") == 0
    assert learner.intake.rejected.total() == 0
    recorded = {episode.id.rpartition("-")[0] for episode in shipped(tmp_path / "episodes")}
    assert recorded == {sessions["greedy"], sessions["exploring"]}  # both are in the episode files
    taken = learner.intake.trained | intake_chunks(tmp_path / "checkpoints")  # trained, or kept to train
    assert {key.partition(":")[0].rpartition("-")[0] for key in taken} == {sessions["exploring"]}


async def test_without_episode_files_a_greedy_session_builds_no_chunks(learner_settings, server_factory):
    """Its chunks could only go to the learner, which must not get them: none is built (nor counted shipped)."""
    learner_server = LearnerServer(learner_settings())
    await learner_server.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", episode_dir=None)
        greedy = EnvClient(gym.make(ENV), target(server), seed=1, client_id="greedy", explore=False)
        async with running_client(greedy):
            await until(lambda: greedy.stats.episodes >= 3, timeout=60)
        await server.stop()  # would ship the running episode's steps
        shipped_total = sum(
            sample.value
            for metric in server.metrics.registry.collect()
            if metric.name == "rlgate_episodes"
            for sample in metric.samples
            if sample.name == "rlgate_episodes_total"
        )
    finally:
        await learner_server.stop()
    assert greedy.stats.episodes >= 3
    assert shipped_total == 0
    assert learner_server.learner.chunks_accepted == 0
