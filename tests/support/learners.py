"""Helpers for tests against real `rlgate learn` processes, and for reading back where chunks went."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import gymnasium as gym

from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.learner.batch_decoder import chunk_key
from rlgate.v1 import episode_pb2, learner_pb2, learner_pb2_grpc
from tests.support import warm

if TYPE_CHECKING:
    from rlgate.learner.main import LearnerServer

ENV = "CartPole-v1"


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (for processes that take a port number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Learners:
    """`rlgate learn` processes (CartPole unless told, seed 0), one after another, on one port and one checkpoint
    directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.checkpoints = directory / "checkpoints"
        self.port = free_port()
        self.processes: list[warm.Process] = []

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, name: str, *flags: str, env: str | None = ENV) -> warm.Process:
        """Start one with these extra `rlgate learn` flags, on `env` (None: the env a --config in `flags` names);
        its log goes to `name`.log."""
        command = [
            *("learn", *(("--env", env) if env else ()), "--seed", "0"),
            *("--port", str(self.port), "--http-port", "0", "--checkpoint-dir", str(self.checkpoints)),
            *flags,
        ]
        with open(self.directory / f"{name}.log", "w") as log:
            process = warm.Process(command, stdout=log, stderr=log)
        self.processes.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def children(pid: int) -> list[int]:
    """The process ids of a process's children (Linux): the learner ranks `rlgate learn --num-learners` started."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def shipped_chunks(directory: Path) -> dict[str, int]:
    """Chunk key -> env steps, for every chunk a server's `episode_dir` recorded as shipped (CartPole)."""
    spaces = (gym.make(ENV).observation_space, gym.spaces.Discrete(2))
    shipped = {}
    for path in directory.glob("*.pb"):
        message = episode_pb2.Episode.FromString(path.read_bytes())
        shipped[chunk_key(message.id, message.chunk_index)] = len(episode_from_proto(message, *spaces))
    return shipped


def intake_chunks(checkpoints: Path) -> set[str]:
    """Keys of the chunks held in a learner's intake files (acknowledged, in no checkpoint yet)."""
    keys = set()
    for path in (checkpoints / "intake").glob("*.pb"):
        batch = learner_pb2.EpisodeBatch.FromString(path.read_bytes())
        keys |= {chunk_key(e.id, e.chunk_index) for e in batch.episodes}
        keys |= {chunk_key(i, c) for table in batch.chunks for i, c in zip(table.ids, table.chunk_indices, strict=True)}
    return keys


async def submit(server: LearnerServer, *batches: learner_pb2.EpisodeBatch) -> list[learner_pb2.EpisodeAck]:
    """Send `batches` to a started LearnerServer on one SubmitEpisodes stream, each after the last one's ack."""
    acks = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = learner_pb2_grpc.LearnerServiceStub(channel).SubmitEpisodes()
        for batch in batches:
            await call.write(batch)
            acks.append(await asyncio.wait_for(call.read(), 30))
        await call.done_writing()
    return acks


async def weights_after(server: LearnerServer, version: int) -> learner_pb2.Weights:
    """The first weights a started LearnerServer pushes to WatchWeights(after_version=`version`)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = learner_pb2_grpc.LearnerServiceStub(channel).WatchWeights(
            learner_pb2.WatchWeightsRequest(server_id="observer", after_version=version)
        )
        weights = await asyncio.wait_for(call.read(), 30)
        call.cancel()
    return weights
