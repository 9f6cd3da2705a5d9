"""The Node.js client acting locally (`clients/node/client.mjs --mode local`): its policy is each version's ONNX file,
which the server sends over PolicyService.WatchWeights (`onnx`), run in onnxruntime-node; its episodes go to the
server's SubmitEpisodes and train a real learner. Its npm dependencies come as for tests/server/test_node_client.py
(skipped without node or npm, failed under CI=true)."""

from __future__ import annotations

import asyncio
import itertools
import json

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from server.test_node_client import node_client, run_client  # noqa: F401 (the fixture)
from support.servers import target, until

from rlgate.learner.main import LearnerServer
from rlgate.server.main import InferenceServer
from rlgate.spec.run import RunSpec
from rlgate.storage.episode_files import read_episodes
from rlgate.v1 import learner_pb2, policy_pb2_grpc


async def test_a_node_client_acting_locally_ships_episodes_that_train_the_learner(
    learner_server: LearnerServer,
    server_factory,
    tmp_path,
    node_client,  # noqa: F811
):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    learner = learner_server.learner
    summary = await run_client(node_client, server.port, "--mode", "local", "--steps", "2500", "--seed", "3")
    await server.stop()  # what the server holds goes to the learner

    # It acted with newer versions as they came, and the learner trained on its steps: every one it took, once.
    assert summary["env_steps"] == 2500 and summary["episodes"] >= 5
    assert len(summary["model_versions"]) >= 3, summary["model_versions"]
    assert summary["steps"] == 2500  # every step shipped, the last episode's cut off
    assert summary["acked_batches"] == summary["batches"] and summary["accepted"] == summary["chunks"]
    assert summary["unacknowledged_batches"] == 0
    assert summary["pauses"] > 0  # the learner's pace held it
    assert server.service.env_steps == 0 and server.local.env_steps == 2500
    assert learner.env_steps_received() == 2500
    assert learner.intake.rejected.total() == 0 and learner.intake.duplicates == 0 and learner.stale_steps == 0
    updates = learner.progress.updates.page(0)["rows"]
    assert len(updates) >= 3 and learner.trainer.version >= 3
    assert learner.trainer.env_steps >= 3 * learner.spec.algorithm.train_batch_size
    assert all(update["staleness"] < 3 for update in updates), [update["staleness"] for update in updates]
    # The server's episode files hold them too (its batches do not name their observation space: the served one),
    # cut as a server cuts a session's: chunks of at most rollout_fragment_length steps (fewer where a pause for the
    # learner's pace shipped the running episode), each after an episode's first starting where the one before
    # ended, with that chunk's last step as its lookback.
    chunks = [c for c in read_episodes(tmp_path / "episodes") if c.id_.startswith(summary["session_id"])]
    assert len(chunks) == summary["chunks"] and sum(len(c) for c in chunks) == 2500
    episodes: dict[str, list] = {}
    for chunk in sorted(chunks, key=lambda c: c.chunk_index):
        episodes.setdefault(chunk.id_, []).append(chunk)
    fragment = learner.spec.sampling.rollout_fragment_length
    for parts in episodes.values():
        assert [p.chunk_index for p in parts] == list(range(len(parts))) and all(len(p) <= fragment for p in parts)
        assert not any(p.is_done for p in parts[:-1]) and parts[-1].is_done
        for before, after in itertools.pairwise(parts):
            assert after.t_started == before.t_started + len(before) and after.observations.lookback == 1
            np.testing.assert_array_equal(after.observations.data[:2], before.observations.data[-2:])
            assert after.actions.data[0] == before.actions.data[-1]
    ended = [sum(len(c) for c in parts) for parts in episodes.values() if parts[-1].is_terminated]
    assert sorted(ended) == sorted(r for r, t in zip(summary["returns"], summary["terminated"], strict=True) if t)


@pytest.mark.slow
async def test_a_node_client_sends_its_unacknowledged_batches_again_to_the_server_that_replaces_its_own(
    learner_server: LearnerServer,
    server_factory,
    node_client,  # noqa: F811
):
    """The server stops mid-run and another starts on its port: the client's streams reopen, it sends every batch
    not acknowledged again, and the learner gets each of its steps once (a batch that reached the first server's
    spool before its ack was lost is dropped by the learner as a duplicate)."""
    learner = learner_server.learner
    first = await server_factory(learner=f"127.0.0.1:{learner_server.port}", drain_timeout_s=0.5)
    run = asyncio.ensure_future(run_client(node_client, first.port, "--mode", "local", "--steps", "2000"))
    try:
        await until(lambda: first.local.env_steps >= 500 or run.done(), timeout=30)
        await first.stop()
        second = await server_factory(learner=f"127.0.0.1:{learner_server.port}", port=first.port)
        summary = await asyncio.wait_for(run, 60)
    finally:
        run.cancel()
    await second.stop()

    assert summary["streams"] >= 2 and second.local.env_steps > 0  # it went on with the new server
    assert summary["steps"] == 2000 and summary["acked_batches"] == summary["batches"]
    assert summary["unacknowledged_batches"] == 0
    assert learner.env_steps_received() == 2000 and learner.intake.rejected.total() == 0
    assert first.local.env_steps + second.local.env_steps >= 2000


@pytest.mark.slow
async def test_a_node_client_moves_to_a_new_channel_at_its_max_session_age_losing_nothing(
    learner_server: LearnerServer,
    server_factory,
    node_client,  # noqa: F811
):
    """At its max session age the server ends the client's WatchWeights with OK: the client half-closes its
    SubmitEpisodes, takes the acks of what it sent, and opens both streams on a new channel (through a Service's
    address, a new connection may reach another replica); it acts on meanwhile, and every step reaches the learner
    once."""
    learner = learner_server.learner
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", max_session_age_s=0.25)
    summary = await run_client(node_client, server.port, "--mode", "local", "--steps", "4000", "--seed", "5")
    await server.stop()

    assert summary["moves"] >= 2 and summary["streams"] >= summary["moves"] + 1, summary
    handovers = server.metrics.registry.get_sample_value("rlgate_handovers_total")
    assert summary["moves"] <= handovers  # each when the server ended the weights stream
    assert summary["steps"] == 4000 and summary["acked_batches"] == summary["batches"]
    assert summary["unacknowledged_batches"] == 0 and len(summary["model_versions"]) >= 2
    assert learner.env_steps_received() == 4000 and learner.intake.rejected.total() == 0


async def first_weights(server: InferenceServer) -> learner_pb2.Weights:
    """The first answer of the server's WatchWeights to a client that asks for ONNX files."""
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        call = stub.WatchWeights(learner_pb2.WatchWeightsRequest(server_id="t", after_version=-1, onnx=True))
        try:
            return await anext(aiter(call))
        finally:
            call.cancel()


async def test_watch_weights_sends_each_version_with_the_onnx_file_of_its_weights(learner_server, server_factory):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    weights = await first_weights(server)
    session = ort.InferenceSession(weights.onnx)
    contract = json.loads(session.get_modelmeta().custom_metadata_map["rlgate.contract"])
    assert contract["model_version"] == weights.version and contract["explore"]
    assert [o["name"] for o in contract["outputs"]] == ["actions", "action_logp", "action_dist_inputs"]
    assert weights.safetensors  # the weights themselves too, as every client gets them


@pytest.mark.parametrize(
    ("env", "spec", "why"),
    [
        ("CartPole-v1", {"connectors": {"env_to_module": ["MeanStdFilter"]}}, "rewrites observations (MeanStdFilter)"),
        ("Pendulum-v1", {}, "the action space is Box"),
    ],
)
async def test_a_run_an_onnx_client_cannot_record_as_a_server_does_is_refused_saying_why(
    server_factory, env, spec, why
):
    server = await server_factory(spec=RunSpec.parse(spec, "test"), env=env)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await first_weights(server)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith("no ONNX file for this run: ") and why in refused.value.details()
