"""A batch the intake's own code (or a user's space) fails on, where no refusal it knows applies: refused whole
("unreadable batch") and acknowledged, since a server re-sends a batch that ended its stream for ever; nothing of
it recorded, and the stream and the learner go on."""

from __future__ import annotations

import asyncio
import logging

import grpc
import gymnasium as gym
import pytest
from gymnasium.spaces import Discrete
from support.batches import episode_batch
from support.intakes import accept
from support.learners import intake_chunks

from rlgate.core import codec
from rlgate.learner.batch_decoder import BatchDecoder, chunk_key
from rlgate.learner.intake import Intake
from rlgate.learner.main import LearnerServer
from rlgate.v1 import learner_pb2_grpc


@pytest.fixture
async def sloppy_learner(learner_settings) -> LearnerServer:
    server = LearnerServer(learner_settings(spec={"env": {"id": "support.sloppy_space_env:SloppySpaceCartPole"}}))
    await server.start()
    yield server
    await server.stop()


async def test_a_batch_whose_sorting_raises_is_refused_whole_and_its_stream_goes_on(
    sloppy_learner, cartpole_chunks, caplog
):
    learner = sloppy_learner.learner
    chunks = cartpole_chunks(40)[:4]
    odd = episode_batch(chunks, seq=1)
    odd.observation_space.CopyFrom(codec.space_to_proto(Discrete(3)))  # decodes; the user's space fails on it
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sloppy_learner.port}") as channel:
        call = learner_pb2_grpc.LearnerServiceStub(channel).SubmitEpisodes()
        with caplog.at_level(logging.WARNING, logger="rlgate.learner.intake"):
            await call.write(odd)
            refused = await asyncio.wait_for(call.read(), 30)
        assert (refused.seq, refused.accepted, refused.duplicates, refused.rejected) == (1, 0, 0, len(chunks))
        assert learner.intake.rejected["unreadable batch"] == len(chunks)
        samples = learner.metrics.registry.get_sample_value
        assert samples("rlgate_learner_rejected_chunks_total", {"reason": "unreadable batch"}) == len(chunks)
        (record,) = [r for r in caplog.records if "AttributeError" in r.getMessage()]
        assert record.exc_info is not None and record.exc_info[0] is AttributeError  # logged once, with its cause
        # Nothing of it was recorded: no pending steps, no intake file, no episode seen.
        assert learner.intake.pending_steps == 0
        assert intake_chunks(sloppy_learner.settings.checkpoint_dir) == set()
        # The same stream goes on, and the same chunks in a batch that fits are new to the learner.
        await call.write(episode_batch(chunks, seq=2))
        ack = await asyncio.wait_for(call.read(), 30)
        assert (ack.seq, ack.accepted, ack.duplicates, ack.rejected) == (2, len(chunks), 0, 0)
        await call.done_writing()
    assert intake_chunks(sloppy_learner.settings.checkpoint_dir) == {chunk_key(c.id_, c.chunk_index) for c in chunks}
    assert learner.intake.pending_steps == sum(len(c) for c in chunks)


def test_a_batch_that_fails_midway_leaves_nothing_behind(tmp_path, cartpole_chunks):
    """The step count (the trainer's `count`) fails on a chunk after others of its batch were sorted: the batch is
    refused whole, and once it no longer fails, taken whole, each episode's return counted once."""
    chunks = cartpole_chunks(120)
    doomed = chunk_key(chunks[6].id_, chunks[6].chunk_index)
    broken = [True]

    def count(episodes):
        if broken[0] and any(chunk_key(e.id_, e.chunk_index) == doomed for e in episodes):
            raise RuntimeError("a bug in counting")
        return sum(map(len, episodes))

    spaces = ([gym.make("CartPole-v1").observation_space], Discrete(2))
    intake = Intake(tmp_path / "intake", BatchDecoder(*spaces), count=count)
    refused = accept(intake, episode_batch(chunks, seq=1))
    assert (refused.accepted, refused.duplicates, refused.rejected) == (0, 0, len(chunks))
    assert (list(intake.pending), intake.pending_steps, intake.episodes_finished) == ([], 0, 0)
    assert list((tmp_path / "intake").glob("*.pb")) == []
    broken[0] = False
    taken = accept(intake, episode_batch(chunks, seq=2))
    assert (taken.accepted, taken.duplicates, taken.rejected) == (len(chunks), 0, 0)
    reference = Intake(tmp_path / "reference", BatchDecoder(*spaces))
    accept(reference, episode_batch(chunks, seq=1))
    assert reference.episodes_finished > 0  # episodes that began before the failing chunk end in this batch
    assert (list(intake.returns), list(intake.lengths)) == (list(reference.returns), list(reference.lengths))
    assert intake.pending_steps == reference.pending_steps
