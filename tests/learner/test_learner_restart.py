"""The learner killed mid-run (SIGKILL) and restarted: every episode chunk the server shipped is trained on
exactly once.

The learner runs as a real `rlgate learn` process; the inference server and a CartPole client run in this
event loop. The server's episode_dir records every chunk it ships. After the run, the final checkpoint's
trained chunks plus the chunks still waiting in the learner's intake files must be exactly the shipped
chunks, and the env steps the checkpointed model was trained on must be the sum of the trained chunks'
lengths: a chunk trained twice, or lost, would break one or the other.

The learner is killed at two moments: while the server ships chunks (its stream to the learner may break
in the middle of a write), and while the server waits for the next version with all its chunks
acknowledged (only the restarted learner can get the run going again).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from support.servers import running_client, target

from client.env_client import EnvClient
from episodes.codec import episode_from_proto
from learner import checkpoint
from learner.intake import chunk_key
from rlgate.v1 import episode_pb2, learner_pb2
from server.main import InferenceServer

ENV = "CartPole-v1"
TRAIN_BATCH_SIZE = 128


class Learners:
    """`rlgate learn` processes, one after another, on one port and one checkpoint directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.checkpoints = directory / "checkpoints"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.processes: list[subprocess.Popen] = []

    def start(self, name: str) -> subprocess.Popen:
        """Start one (checkpoints every 2 versions; quick updates); its log goes to `name`.log."""
        command = [
            *(sys.executable, "-m", "server", "learn", "--env", ENV, "--seed", "0"),
            *("--port", str(self.port), "--http-port", "0", "--checkpoint-dir", str(self.checkpoints)),
            *("--checkpoint-every", "2", "--train-batch-size", str(TRAIN_BATCH_SIZE)),
            *("--minibatch-size", "64", "--num-epochs", "2"),
        ]
        with open(self.directory / f"{name}.log", "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes.append(process)
        return process


@pytest.fixture
def learners(tmp_path: Path) -> Iterator[Learners]:
    """Learner processes for one test; any still running at teardown are killed."""
    learners = Learners(tmp_path)
    yield learners
    for process in learners.processes:
        if process.poll() is None:
            process.kill()
        process.wait()


async def until(condition: Callable[[], bool], timeout: float) -> None:
    """Poll `condition` until it holds (bounded in time)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def served(server: InferenceServer) -> int:
    return server.policy.version if server.policy else -1


def shipping(server: InferenceServer, spool: Path) -> bool:
    """The server has just taken version 3 and samples and ships chunks under it."""
    return served(server) >= 3


def waiting(server: InferenceServer, spool: Path) -> bool:
    """The server sampled all it may under version 3 (or later), was acked for all of it, and waits for the
    next version: the learner holds those chunks untrained, and nothing more comes unless it trains them."""
    return served(server) >= 3 and server.batcher.paused() and not any(spool.rglob("*.pb"))


@pytest.mark.parametrize("moment", [shipping, waiting], ids=lambda moment: moment.__name__)
async def test_a_learner_killed_mid_run_and_restarted_trains_every_shipped_chunk_exactly_once(
    tmp_path, learners, server_factory, moment
):
    checkpoints, shipped_dir = learners.checkpoints, tmp_path / "shipped"
    server = await server_factory(
        learner=f"127.0.0.1:{learners.port}",
        steps_per_version=TRAIN_BATCH_SIZE,
        rollout_fragment_length=16,  # many chunks, and episodes cut into several
        episode_dir=shipped_dir,
    )
    first = learners.start("learner-1")
    client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)]), target(server), seed=0)
    async with running_client(client):
        # Checkpoints come every 2 versions: at version 3 the learner restarts from version 2, and the server
        # must not wait for a "version 3" it already has.
        await until(lambda: moment(server, tmp_path / "spool"), timeout=60)
        assert any((checkpoints / "intake").glob("*.pb"))  # acknowledged chunks in no checkpoint yet
        first.kill()
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        killed_at, resumed_from = served(server), checkpoint.load(checkpoints).version

        second = learners.start("learner-2")
        await until(lambda: served(server) >= max(killed_at, resumed_from) + 3, timeout=60)
    await server.stop()  # ships the open episodes (truncated) and waits for the learner's acks
    assert not list((tmp_path / "spool").rglob("*.pb")), "the server has unacknowledged batches left"
    second.send_signal(signal.SIGTERM)  # a clean stop writes a final checkpoint
    assert await asyncio.to_thread(second.wait, 30) == 0
    assert f"v{resumed_from:06d} version={resumed_from}" in (tmp_path / "learner-2.log").read_text()  # it resumed

    spaces = (gym.make(ENV).observation_space, gym.spaces.Discrete(2))
    shipped = {}
    for path in shipped_dir.glob("*.pb"):
        message = episode_pb2.Episode.FromString(path.read_bytes())
        shipped[chunk_key(message.id, message.chunk_index)] = len(episode_from_proto(message, *spaces))
    final = checkpoint.load(checkpoints)
    trained = final.trained_chunks
    untrained = set()
    for path in (checkpoints / "intake").glob("*.pb"):
        batch = learner_pb2.EpisodeBatch.FromString(path.read_bytes())
        untrained |= {chunk_key(e.id, e.chunk_index) for e in batch.episodes} - set(trained)

    assert len(trained) == len(set(trained)) > 0
    assert set(trained) | untrained == set(shipped), "a shipped chunk was lost, or an unknown one trained"
    assert final.env_steps == sum(shipped[key] for key in trained), "a chunk was trained more (or less) than once"
    assert final.version >= max(killed_at, resumed_from) + 3
