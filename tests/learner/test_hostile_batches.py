"""Hypothesis against a real learner: episode batches from a hostile (or broken) server (support/hostile.py).

Every batch is acknowledged on its stream (a batch that fails it would come back from the server's spool for
ever), each of its chunks counted once as accepted, duplicate or rejected; what the intake takes never fails an
update (which would drop every server's steps batched with it); and the learner trains on after it all.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.batches import episode_batch
from support.hostile import hostile_batches
from support.servers import until

from rlgate.core import codec
from rlgate.learner.main import LearnerServer
from rlgate.v1 import learner_pb2, learner_pb2_grpc

HOSTILE = settings(
    max_examples=150,  # a few seconds; the long test below draws 3,000
    deadline=None,
    # One learner for all examples, on purpose; a batch is drawn in a few ms, but a loaded machine is slower.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_fresh = itertools.count()


class Submitter:
    """One SubmitEpisodes stream to a started learner, and chunks that make a valid batch."""

    def __init__(self, server: LearnerServer, chunks: list) -> None:
        self.server, self.chunks = server, chunks
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        self.call = learner_pb2_grpc.LearnerServiceStub(self.channel).SubmitEpisodes()

    def base(self) -> learner_pb2.EpisodeBatch:
        """A valid batch of 3 chunks under ids never sent before, by the learner's current version."""
        batch = episode_batch(self.chunks, seq=next(_fresh))
        table = batch.chunks[0]
        table.ids[:] = [f"{batch.seq}-{i}" for i in range(len(table.ids))]
        version = self.server.learner.trainer.version
        table.model_versions.CopyFrom(codec.to_tensor(np.full(table.model_versions.shape, version, np.int64)))
        return batch

    async def submit(self, batch: learner_pb2.EpisodeBatch) -> learner_pb2.EpisodeAck:
        await self.call.write(batch)
        return await asyncio.wait_for(self.call.read(), 30)


@pytest.fixture
async def submitter(learner_server, cartpole_chunks) -> AsyncIterator[Submitter]:
    submitter = Submitter(learner_server, cartpole_chunks(60)[:3])
    yield submitter
    # After it all, valid data still trains: an update runs, and none has failed.
    learner = learner_server.learner
    updates = learner.progress.updates.total
    for _ in range(6):
        await submitter.submit(submitter.base())
    await until(lambda: learner.progress.updates.total > updates, 30)
    await submitter.call.done_writing()
    await submitter.channel.close()
    assert learner.metrics.registry.get_sample_value("rlgate_learner_failed_updates_total") == 0
    assert all(torch.isfinite(p).all() for p in learner.trainer.module.parameters())


async def check(submitter: Submitter, batch: learner_pb2.EpisodeBatch) -> None:
    ack = await submitter.submit(batch)  # the stream goes on: a batch that ended it would come back for ever
    chunks = len(batch.episodes) + sum(len(table.ids) for table in batch.chunks)
    assert ack.seq == batch.seq
    assert ack.accepted + ack.duplicates + ack.rejected == chunks
    learner = submitter.server.learner
    assert learner.metrics.registry.get_sample_value("rlgate_learner_failed_updates_total") == 0


@HOSTILE
@given(data=st.data())
@pytest.mark.slow
async def test_hostile_batches_are_acknowledged_and_never_fail_an_update(submitter, data):
    await check(submitter, data.draw(hostile_batches(submitter.base())))


@pytest.mark.long
@pytest.mark.timeout(600)
@settings(HOSTILE, max_examples=3_000)
@given(data=st.data())
async def test_many_hostile_batches(submitter, data):
    await check(submitter, data.draw(hostile_batches(submitter.base())))
