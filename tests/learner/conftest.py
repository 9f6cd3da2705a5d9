"""Fixtures for the learner tests: fast PPO settings, real learner and inference servers on port 0, and
CartPole chunks made the way a server makes them (Policy + Session), so intake and trainer see what a
server ships."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support.batches import episode_batch
from support.chunks import decoded
from support.learners import Learners

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.session import Session, SessionSpec
from rlgate.learner.main import LearnerServer
from rlgate.learner.settings import LearnerSettings
from rlgate.policy.acting import ActingCore
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2, learner_pb2_grpc

ENV = "CartPole-v1"
# Small, quick PPO updates: an update takes milliseconds, so versions advance fast.
FAST = {
    "algorithm": {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 2},
    "sampling": {"rollout_fragment_length": 32},
    "seed": 0,
}


@pytest.fixture
def learner_settings(tmp_path: Path) -> Callable[..., LearnerSettings]:
    """learner_settings(**overrides): CartPole, port 0, fast updates, checkpoints under tmp_path."""

    def make(spec: dict[str, Any] | None = None, **overrides: Any) -> LearnerSettings:
        """`spec`: run spec fields over FAST's (e.g. {"connectors": {"env_to_module": ["MeanStdFilter"]}})."""
        fields = {
            "env": ENV,
            "host": "127.0.0.1",
            "port": 0,
            "http_port": 0,
            "checkpoint_dir": tmp_path / "checkpoints",
            "spec": {**FAST, **(spec or {})},
        }
        fields.update(overrides)
        return LearnerSettings(**fields)

    return make


@pytest.fixture
async def learner_server(learner_settings: Callable[..., LearnerSettings]) -> AsyncIterator[LearnerServer]:
    """A started LearnerServer (fast settings), stopped at teardown (which writes a final checkpoint)."""
    server = LearnerServer(learner_settings())
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def learners(tmp_path: Path) -> Iterator[Learners]:
    """`rlgate learn` processes for one test; any still running at teardown are killed."""
    learners = Learners(tmp_path)
    yield learners
    learners.kill_all()


@pytest.fixture
def cartpole_chunks() -> Callable[..., list[SingleAgentEpisode]]:
    """cartpole_chunks(steps, version=0, seed=0, spec=None): shipped chunks holding at least `steps` CartPole env
    steps.

    A real policy (fresh model of `spec`, the default run spec's if None, recording `version` as MODEL_VERSION)
    acts in 4 real CartPole envs through a real server Session, which cuts running episodes every 16 steps, as
    the server does.
    """

    def make(steps: int, *, version: int = 0, seed: int = 0, spec: RunSpec | None = None) -> list[SingleAgentEpisode]:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)])
        session_spec = SessionSpec("test", envs.single_observation_space, envs.single_action_space, 4, explore=True)
        policy = ActingCore.build(
            spec or RunSpec(),
            session_spec.observation_space,
            session_spec.action_space,
            version=version,
            seed=seed,
        )
        session = Session(session_spec, rollout_fragment_length=16, lookback=1)
        obs, _ = envs.reset(seed=seed)
        rewards, terminateds, truncateds = np.zeros(4), np.zeros(4, bool), np.zeros(4, bool)
        chunks: list[SingleAgentEpisode] = []
        shipped = 0
        for _ in range(steps + 20):  # each round adds 4 env steps; at most 4 * 16 wait in running episodes
            episodes, _ = session.observe(obs, rewards, terminateds, truncateds, None)
            outputs = policy.act(episodes, True, obs)
            done = decoded(session.record(outputs))
            chunks += done
            shipped += sum(len(c) for c in done)
            if shipped >= steps:
                break
            obs, rewards, terminateds, truncateds, _ = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
        envs.close()
        assert shipped >= steps
        return chunks

    return make


@pytest.fixture
def train_updates(
    cartpole_chunks: Callable[..., list[SingleAgentEpisode]],
) -> Callable[[LearnerServer, int], Awaitable[list[learner_pb2.EpisodeAck]]]:
    """await train_updates(learner_server, n): n updates, each on one train batch of CartPole chunks sent
    through SubmitEpisodes; returns the acks once the learner has recorded and published the n-th update."""

    async def train(learner_server: LearnerServer, updates: int) -> list[learner_pb2.EpisodeAck]:
        learner = learner_server.learner
        acks = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
            call = learner_pb2_grpc.LearnerServiceStub(channel).SubmitEpisodes()
            for seq in range(1, updates + 1):  # each batch after the previous update, so one update per batch
                chunks = cartpole_chunks(learner.spec.algorithm.train_batch_size, seed=seq)
                await call.write(episode_batch(chunks, seq))
                async with asyncio.timeout(30):
                    acks.append(await call.read())
                    # The update's stats are recorded, then its weights published (Learner._update).
                    while learner.progress.updates.total < seq or learner.weights.version != learner.trainer.version:
                        await asyncio.sleep(0.01)
            await call.done_writing()
        return acks

    return train
