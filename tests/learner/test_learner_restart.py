"""The learner killed mid-run (SIGKILL) and restarted: every episode chunk the server shipped is trained on
exactly once, its sessions' and its local-inference clients' alike.

The learner runs as a real `rlgate learn` process; the inference server and a CartPole client (acting through the
server, or itself and sending the server its episodes) run in this event loop. The server's episode_dir records
every chunk it ships, its local clients' too. After the run, the final checkpoint's trained chunks plus the chunks
still waiting in the learner's intake files must be exactly the shipped chunks, and the env steps the checkpointed
model was trained on must be the sum of the trained chunks' lengths: a chunk trained twice, or lost, would break one
or the other.

With two data-parallel learners (`--num-learners 2`), rank 1 is killed instead: rank 0 ends with it, and the
restarted pair goes on from the checkpoint alike, with PPO, DQN and (discrete) SAC. An off-policy chunk counts as
trained once it joined the replay buffer (rank 0's): the restarted pair starts with an empty buffer, as a
checkpoint keeps none by default.

The learner is killed at two moments: while the server ships chunks (its stream to the learner may break
in the middle of a write), and while the server (or the local client) waits for the next version with all its chunks
acknowledged (only the restarted learner can get the run going again).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from support.learners import ENV, children, intake_chunks, shipped_chunks
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.server.main import InferenceServer
from rlgate.storage import checkpoint

TRAIN_BATCH_SIZE = 128
# Every run: checkpoints every 2 versions; many chunks, and episodes cut into several.
EVERY_RUN = ("--checkpoint-every", "2", "--spec.sampling.rollout-fragment-length", "16")
# PPO: quick updates.
QUICK = (*EVERY_RUN, "--spec.algorithm.train-batch-size", str(TRAIN_BATCH_SIZE))
QUICK += ("--spec.algorithm.minibatch-size", "64", "--spec.algorithm.num-epochs", "2")
# DQN and SAC (discrete): updates of 32 transitions from the first 64 env steps on, one per env step, a version
# every 4 updates.
OFF_POLICY = (*EVERY_RUN, "--spec.algorithm.train-batch-size", "32", "--spec.algorithm.training-intensity", "32")
OFF_POLICY += ("--spec.algorithm.broadcast-interval", "4")
OFF_POLICY += ("--spec.algorithm.num-steps-sampled-before-learning-starts", "64")


def served(server: InferenceServer) -> int:
    return server.host.core.version if server.host.core else -1


def shipping(server: InferenceServer, client: EnvClient, spool: Path) -> bool:
    """The server has just taken version 3 and samples and ships chunks under it."""
    return served(server) >= 3


def waiting(server: InferenceServer, client: EnvClient, spool: Path) -> bool:
    """The server sampled all it may under version 3 (or later), was acked for all of it, and waits for the
    next version: the learner holds those chunks untrained, and nothing more comes unless it trains them. A local
    client: it waits for the learner's pace (the server holds what it shipped, or the learner does)."""
    if client.inference == "local":
        return served(server) >= 3 and client.stats.paused is not None
    return served(server) >= 3 and server.host.batcher.paused() and not any(spool.rglob("*.pb"))


KILLS: list[Any] = [
    (inference, moment, 1, "PPO") for inference in ("server", "local") for moment in (shipping, waiting)
]
# Two data-parallel learners: rank 1 killed, and rank 0 ends with it (three processes start twice). DQN's rank 0
# holds the replay buffer and scatters each update's batch: its chunks are counted as they join the buffer.
KILLS += [("server", shipping, 2, algo) for algo in ("PPO", "DQN", "SAC")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inference", "moment", "num_learners", "algo"),
    KILLS,
    ids=lambda value: getattr(value, "__name__", None) or (f"{value}-learners" if isinstance(value, int) else value),
)
async def test_a_learner_killed_mid_run_and_restarted_trains_every_shipped_chunk_exactly_once(
    tmp_path, learners, server_factory, moment, inference, num_learners, algo
):
    checkpoints, shipped_dir = learners.checkpoints, tmp_path / "shipped"
    server = await server_factory(
        learner=learners.target,
        episode_dir=shipped_dir,
        drain_timeout_s=30,  # time for the second learner to ack the last episodes at the stop, on a loaded machine
    )
    flags = (*(QUICK if algo == "PPO" else ("--algo", algo, *OFF_POLICY)), "--num-learners", str(num_learners))
    first = learners.start("learner-1", *flags)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)])
    client = EnvClient(envs, target(server), seed=0, inference=inference, spool_dir=tmp_path / "client-spool")
    async with running_client(client):
        # Checkpoints come every 2 versions: at version 3 the learner restarts from version 2, and the server
        # must not wait for a "version 3" it already has.
        await until(lambda: moment(server, client, tmp_path / "spool"), timeout=60)
        assert any((checkpoints / "intake").glob("*.pb"))  # acknowledged chunks in no checkpoint yet
        if num_learners == 1:
            first.kill()
            assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        else:
            (rank_1,) = children(first.pid)
            os.kill(rank_1, signal.SIGKILL)
            assert await asyncio.to_thread(first.wait, 10) == 1  # data_parallel.FAILED
        killed_at, resumed_from = served(server), checkpoint.load(checkpoints).version

        second = learners.start("learner-2", *flags)
        await until(lambda: served(server) >= max(killed_at, resumed_from) + 3, timeout=60)
    await server.stop()  # ships the open episodes (truncated) and waits for the learner's acks
    assert not list((tmp_path / "spool").rglob("*.pb")), "the server has unacknowledged batches left"
    assert not list((tmp_path / "client-spool").rglob("*.pb")), "the client has unacknowledged batches left"
    second.send_signal(signal.SIGTERM)  # a clean stop writes a final checkpoint
    assert await asyncio.to_thread(second.wait, 30) == 0
    assert f"v{resumed_from:06d} version={resumed_from}" in (tmp_path / "learner-2.log").read_text()  # it resumed

    shipped = shipped_chunks(shipped_dir)
    final = checkpoint.load(checkpoints)
    trained = final.trained_chunks
    untrained = intake_chunks(checkpoints) - set(trained)

    assert len(trained) == len(set(trained)) > 0
    assert set(trained) | untrained == set(shipped), "a shipped chunk was lost, or an unknown one trained"
    steps = sum(shipped[key] for key in trained) + sum(final.partial_chunks.values())  # split chunks: their heads
    assert final.env_steps == steps, "a step was trained more (or less) than once"
    assert set(final.partial_chunks) <= untrained  # a split chunk's remainder waits in the intake
    assert final.version >= max(killed_at, resumed_from) + 3
