"""A learner that falls behind: the server's spool fills up to `max_spool`, sampling pauses (the clients
wait; nothing they sent is dropped), and once the learner takes batches again the spool drains, sampling
resumes, and every chunk the server shipped reaches the learner.

The learner is a real `rlgate learn` process that never trains, so no new model version ever wakes the
server: only its spool draining may. It falls behind in two ways: stalled (SIGSTOP, then SIGCONT: its
streams stay open) and gone (SIGKILL, then a new process on the same port: the server reconnects).
"""

from __future__ import annotations

import asyncio
import signal

import gymnasium as gym
import pytest
from support.learners import ENV, intake_chunks, shipped_chunks
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient

LIMIT = 16 << 10  # a few batches of 4 envs' 8-step chunks
NEVER = ("--spec.algorithm.train-batch-size", "1000000000", "--checkpoint-every", "1000000000")
NEVER += ("--spec.sampling.rollout-fragment-length", "8")


@pytest.mark.slow
@pytest.mark.parametrize("falls_behind", ["stalled", "gone"])
async def test_a_full_spool_pauses_sampling_until_the_learner_catches_up(
    learners, server_factory, tmp_path, falls_behind
):
    shipped_dir = tmp_path / "shipped"
    learner = learners.start("learner-1", *NEVER)
    server = await server_factory(learner=learners.target, max_spool=LIMIT, episode_dir=shipped_dir)
    await until(lambda: server.host.core is not None, timeout=60)  # the learner's first weights
    if falls_behind == "stalled":
        learner.send_signal(signal.SIGSTOP)
    else:
        learner.kill()
        await asyncio.to_thread(learner.wait, 10)

    client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)]), target(server), seed=0)
    async with running_client(client):
        await until(server.host.batcher.paused, timeout=30)
        assert server.status.status()["paused"] == "spool full: waiting for the learner"
        # Paused means no batch runs: the client gets at most the reply already on its way...
        stalled_at = client.stats.env_steps
        with pytest.raises(TimeoutError):
            await until(lambda: client.stats.env_steps > stalled_at + 4, timeout=1.0)
        # ...and the spool stops growing: it overshoots the limit by at most the last batch written.
        assert LIMIT <= server.learner.spool.bytes < 2 * LIMIT
        assert server.metrics.registry.get_sample_value("rlgate_spool_bytes") == server.learner.spool.bytes

        if falls_behind == "stalled":
            learner.send_signal(signal.SIGCONT)
        else:
            learner = learners.start("learner-2", *NEVER)
        await until(lambda: client.stats.env_steps > stalled_at + 400, timeout=60)  # the spool drained
    await server.stop()  # sends what is left in the spool
    assert not server.learner.spool.files() and server.learner.spool.bytes == 0
    learner.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(learner.wait, 30) == 0

    shipped = set(shipped_chunks(shipped_dir))
    assert len(shipped) > 50
    assert shipped <= intake_chunks(learners.checkpoints), "a shipped chunk never reached the learner"
