"""Nothing non-finite reaches training or the servers: the intake rejects such chunks (counted, in /status and
/metrics), and an update that still ends with non-finite weights is undone, never published."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load as load_tensors
from support.batches import episode_batch as batch
from support.intakes import accept
from support.learners import submit, weights_after

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.batch_decoder import BatchDecoder
from rlgate.learner.intake import Intake
from rlgate.learner.main import LearnerServer
from rlgate.learner.trainer import Trainer
from rlgate.models import build_module, weights_to_bytes
from rlgate.spec.build import build_learner_connector
from rlgate.spec.imports import ImportPolicy

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space
ACTION_SPACE = gym.spaces.Discrete(2)


def poison(chunk: SingleAgentEpisode, column: str, value: float = np.inf) -> SingleAgentEpisode:
    """Set every value of one column of `chunk` (rewards, observations or a model output) to `value`."""
    buffer = {"rewards": chunk.rewards, "observations": chunk.observations}.get(column)
    buffer = buffer or chunk.extra_model_outputs[column]
    buffer.data = np.full_like(buffer.data, value)  # decoded chunks are read-only views of their message
    return chunk


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_the_intake_rejects_chunks_with_nonfinite_rewards_observations_or_model_outputs(
    tmp_path, cartpole_chunks, tables
):
    good, *bad = cartpole_chunks(100)[:4]
    poison(bad[0], "rewards")  # the audit's chunk: every reward +inf
    poison(bad[1], "observations", -np.inf)  # CartPole's velocity bounds are infinite: the space allows it
    poison(bad[2], Columns.ACTION_LOGP, np.nan)
    rejected = []
    decoder = BatchDecoder([OBSERVATION_SPACE], ACTION_SPACE)
    intake = Intake(tmp_path, decoder, on_reject=lambda reason, n: rejected.extend([reason] * n))
    ack = accept(intake, batch([good, *bad], tables=tables))
    assert (ack.accepted, ack.rejected) == (1, 3)
    assert [c.id_ for c in intake.pending] == [good.id_]
    reasons = ["non-finite rewards", "non-finite observations", "non-finite model outputs"]
    assert intake.rejected == Counter(reasons) and rejected == reasons


def test_an_env_that_means_infinite_observations_may_send_them(tmp_path, cartpole_chunks):
    chunk, other = cartpole_chunks(40)[:2]
    intake = Intake(tmp_path, BatchDecoder([OBSERVATION_SPACE], ACTION_SPACE, allow_nonfinite_obs=True))
    ack = accept(intake, batch([poison(chunk, "observations"), poison(other, "rewards")]))
    assert (ack.accepted, ack.rejected) == (1, 1)  # rewards must be finite all the same
    assert intake.rejected == Counter(["non-finite rewards"])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # GAE on +inf rewards: NaN
def test_an_update_that_ends_non_finite_is_undone_and_the_version_kept(learner_settings, cartpole_chunks):
    spec = learner_settings().spec
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    trainer = Trainer(module, pipeline, spec.algorithm, max_staleness=4, seed=0)
    trainer.update(cartpole_chunks(128))  # Adam has moments to lose
    weights, moments = weights_to_bytes(module), [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    chunks = cartpole_chunks(128, version=1, seed=1)
    stats = trainer.update([poison(chunks[0], "rewards"), *chunks[1:]])  # past the intake: the trainer's guard
    assert "non-finite values in" in stats["skipped"]
    assert trainer.version == 1 and weights_to_bytes(module) == weights
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(trainer.optimizer.state.values(), moments, strict=True))
    trainer.update(cartpole_chunks(128, version=1, seed=2))
    assert trainer.version == 2 and weights_to_bytes(module) != weights


async def test_a_chunk_of_infinite_rewards_does_not_poison_the_weights_servers_get(
    learner_server, cartpole_chunks, http_get
):
    learner = learner_server.learner
    chunks = cartpole_chunks(learner.spec.algorithm.train_batch_size)
    (ack,) = await submit(learner_server, batch([poison(cartpole_chunks(20, seed=9)[0], "rewards"), *chunks]))
    assert (ack.accepted, ack.rejected) == (len(chunks), 1)
    weights = await weights_after(learner_server, 0)  # the update on the good chunks, pushed to every server
    assert weights.version == 1
    assert all(torch.isfinite(t).all() for t in load_tensors(weights.safetensors).values())
    status = json.loads((await http_get(learner_server.http_port, "/status"))[1])
    assert status["rejected_chunks"] == {"non-finite rewards": 1} and status["skipped_updates"] == 0
    metrics = (await http_get(learner_server.http_port, "/metrics"))[1]
    assert 'rlgate_learner_rejected_chunks_total{reason="non-finite rewards"} 1.0' in metrics
    assert "process_resident_memory_bytes" in metrics  # prometheus_client's process collector


async def test_an_update_gone_non_finite_is_counted_and_never_published(learner_settings, cartpole_chunks, http_get):
    """An env that allows infinite observations sends one: the update goes NaN, is undone, and no version follows."""
    server = LearnerServer(learner_settings(spec={"env": {"id": "CartPole-v1", "allow_nonfinite_obs": True}}))
    await server.start()
    try:
        chunks = cartpole_chunks(server.learner.spec.algorithm.train_batch_size)
        (ack,) = await submit(server, batch([poison(chunks[0], "observations"), *chunks[1:]]))
        assert (ack.accepted, ack.rejected) == (len(chunks), 0)
        async with asyncio.timeout(30):
            while server.learner.skipped_updates == 0:
                await asyncio.sleep(0.01)
        assert server.learner.weights.version == 0 and server.learner.trainer.version == 0
        status = json.loads((await http_get(server.http_port, "/status"))[1])
        assert status["skipped_updates"] == 1 and "non-finite values in" in status["last_update"]["skipped"]
        metrics = (await http_get(server.http_port, "/metrics"))[1]
        assert "rlgate_learner_skipped_updates_total 1.0" in metrics
    finally:
        await server.stop()
