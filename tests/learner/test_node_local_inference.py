"""The Node.js client acting locally (`clients/node/client.mjs --mode local`): its policy is each version's ONNX file,
which the server sends over PolicyService.WatchWeights (`onnx`), run in onnxruntime-node; its episodes go to the
server's SubmitEpisodes and train a real learner, CartPole's (Discrete actions) and Pendulum's (Box actions: the
episodes hold the module's own, the env gets them unsquashed); with --spool-dir its unacknowledged batches outlive
a kill. Its npm dependencies come as for tests/server/test_node_client.py (skipped without node or npm, failed under
CI=true)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch
from server.test_node_client import CLIENT, client_command, node_client, required_command, run_client  # noqa: F401
from support.servers import target, until

from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.export.pieces import NotExportable
from rlgate.learner.main import LearnerServer
from rlgate.models import DiagGaussian
from rlgate.policy.published import core_from_weights, spec_of
from rlgate.policy.published_onnx import OnnxWeights
from rlgate.server.main import InferenceServer
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage.episode_files import read_episodes
from rlgate.v1 import learner_pb2, policy_pb2, policy_pb2_grpc


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
    assert summary["pauses"] > 0 and summary["spool_full"] == 0  # the learner's pace held it, not a full spool
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


async def test_a_node_client_killed_with_batches_unacknowledged_sends_them_when_started_again(
    learner_server: LearnerServer,
    server_factory,
    tmp_path,
    node_client,  # noqa: F811
):
    """With --spool-dir a batch is on disk before it is sent and until its ack (and the directory is the running
    client's alone): the client is killed (SIGKILL) while its server is away and batches wait for acks, started again
    with the same directory on a new server, and sends them first; the learner behind that server gets each of them
    once, and every step of the run after. The first server keeps episode files and sets no pace (no learner), so
    with it away the client samples on until its spool holds --max-spool-bytes (a batch over at most), and waits:
    batches are surely left."""
    learner = learner_server.learner
    spool = tmp_path / "node-spool"
    local = ("--mode", "local", "--spool-dir", str(spool), "--client-id", "restarted")
    first = await server_factory(env="CartPole-v1", drain_timeout_s=0.5)
    limit = 16384  # ~900 of CartPole's steps
    command = client_command(node_client, first.port, *local, "--steps", "1000000", "--max-spool-bytes", str(limit))
    killed = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=node_client[1]
    )
    stderr = Stderr(killed)
    try:
        await until(lambda: first.local.env_steps >= 300 or killed.returncode is not None, timeout=30)
        # One process per spool: a second one with the same directory is refused while the first lives.
        refusal = await asyncio.create_subprocess_exec(
            *client_command(node_client, first.port, *local), stderr=asyncio.subprocess.PIPE, cwd=node_client[1]
        )
        try:
            _, refused = await asyncio.wait_for(refusal.communicate(), 30)
        finally:
            if refusal.returncode is None:  # (timed out)
                refusal.kill()
                await refusal.wait()
        assert refusal.returncode == 1 and f"is in use by process {killed.pid}" in refused.decode()
        await first.stop()  # what it acknowledged is in the episode files; the client samples on into its spool
        await until(lambda: stderr.said("spool full") or killed.returncode is not None, timeout=30)
        assert killed.returncode is None, "the client ended before it was killed"
    finally:
        killed.kill()
        await killed.wait()
        await stderr.task
    files = sorted(spool.glob("*.batch"))
    sizes = [f.stat().st_size for f in files]
    assert limit <= sum(sizes) < limit + max(sizes), sizes  # full, then it waited
    left = [policy_pb2.EpisodeSubmission.FromString(f.read_bytes()).batch for f in files]
    left_chunks = {(i, int(c)) for b in left for t in b.chunks for i, c in zip(t.ids, t.chunk_indices, strict=True)}
    taken = {(c.id_, c.chunk_index) for c in read_episodes(tmp_path / "episodes")}  # the first server's

    second = await server_factory(learner=f"127.0.0.1:{learner_server.port}", port=first.port)
    summary = await run_client(node_client, second.port, *local, "--steps", "300")
    await second.stop()

    assert summary["resent_batches"] == len(left) >= 2 and summary["unacknowledged_batches"] == 0
    assert not list(spool.glob("*.batch"))  # each deleted after its ack
    # What both servers took (a batch the first acknowledged but the client had not deleted yet is sent again),
    # each chunk once; the learner's steps are exactly those of the chunks the second took.
    chunks = {(c.id_, c.chunk_index): c for c in read_episodes(tmp_path / "episodes")}
    assert left_chunks <= chunks.keys()
    assert learner.intake.rejected.total() == 0 and learner.stale_steps == 0
    assert learner.env_steps_received() == sum(len(c) for key, c in chunks.items() if key not in taken - left_chunks)
    # The killed run's episodes have no chunk missing, each starting where the one before ended.
    episodes: dict[str, list] = {}
    for (episode_id, _), chunk in sorted(chunks.items()):
        if not episode_id.startswith(summary["session_id"]):
            episodes.setdefault(episode_id, []).append(chunk)
    assert {episode_id for episode_id, _ in left_chunks} <= episodes.keys()
    for parts in episodes.values():
        assert [p.chunk_index for p in parts] == list(range(len(parts)))
        assert all(a.t_started + len(a) == b.t_started for a, b in itertools.pairwise(parts))
    assert sum(len(c) for c in chunks.values() if c.id_.startswith(summary["session_id"])) == 300


class Stderr:
    """A process's stderr lines, read as they come, until it ends (`task`)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self.task = asyncio.create_task(self._read(process))

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            self.lines.append(line.decode())

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)


async def first_weights(server: InferenceServer) -> learner_pb2.Weights:
    """The first answer of the server's WatchWeights to a client that asks for ONNX files."""
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        call = stub.WatchWeights(learner_pb2.WatchWeightsRequest(server_id="t", after_version=-1, onnx=True))
        try:
            return await anext(aiter(call))
        finally:
            call.cancel()


def test_a_spool_lock_names_its_process_by_pid_and_start_time(tmp_path):
    """The Node client's `.lock` (clients/node/spool.mjs): held while its process runs, taken over once that
    process is gone, even when its pid now belongs to another process (a pid reused after a kill)."""
    node = required_command("node", "nodejs")
    stat = Path("/proc/self/stat").read_text()
    alive = f"{os.getpid()} {stat[stat.rindex(')') + 2 :].split()[19]}"  # this process: pid and start time
    script = (
        "import { Spool } from './spool.mjs';\n"
        "try { new Spool(process.argv[1], null).close(); console.log('taken'); }\n"
        "catch (error) { console.log(error.message); }\n"
    )
    said = {}
    for held in (alive, f"{os.getpid()} 1"):  # the second: this pid, as another process's (another start time)
        (tmp_path / ".lock").write_text(held)
        ran = subprocess.run(
            [node, "--input-type=module", "-e", script, str(tmp_path)],
            cwd=CLIENT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        said[held] = ran.stdout.strip()
    assert said == {alive: f"--spool-dir {tmp_path} is in use by process {os.getpid()}", f"{os.getpid()} 1": "taken"}
    assert not (tmp_path / ".lock").exists()  # closed: its lock gone with it


async def test_watch_weights_sends_each_version_with_the_onnx_file_of_its_weights(learner_server, server_factory):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    weights = await first_weights(server)
    session = ort.InferenceSession(weights.onnx)
    contract = json.loads(session.get_modelmeta().custom_metadata_map["rlgate.contract"])
    assert contract["model_version"] == weights.version and contract["explore"]
    assert [o["name"] for o in contract["outputs"]] == ["actions", "action_logp", "action_dist_inputs"]
    assert weights.safetensors  # the weights themselves too, as every client gets them


async def test_a_run_an_onnx_client_cannot_record_as_a_server_does_is_refused_saying_why(server_factory):
    spec = RunSpec.parse({"connectors": {"env_to_module": ["MeanStdFilter"]}}, "test")
    server = await server_factory(spec=spec, env="CartPole-v1")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await first_weights(server)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = refused.value.details()
    assert details.startswith("no ONNX file for this run: ") and "rewrites observations (MeanStdFilter)" in details


def test_integer_box_actions_get_no_onnx_file_for_a_client_to_record():
    """No distribution samples an integer Box's actions as the module's own: refused before anything is built."""
    weights = learner_pb2.Weights(
        spec_json=RunSpec().model_dump_json(),
        observation_space=codec.space_to_proto(gym.spaces.Box(-1.0, 1.0, (3,), np.float32)),
        action_space=codec.space_to_proto(gym.spaces.Box(0, 4, (2,), np.int64)),
    )
    with pytest.raises(NotExportable, match="records Discrete, MultiDiscrete and float Box actions"):
        OnnxWeights(weights, ImportPolicy(()))


@pytest.fixture
def pendulum_learner(learner_settings) -> LearnerServer:
    """A learner of Pendulum-v1 (Box actions), not started."""
    return LearnerServer(learner_settings(env="Pendulum-v1"))


async def collect_weights(server: InferenceServer, into: dict[int, learner_pb2.Weights]) -> None:
    """Every version the server's WatchWeights sends, by version, until cancelled."""
    async with grpc.aio.insecure_channel(target(server)) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        async for weights in stub.WatchWeights(learner_pb2.WatchWeightsRequest(server_id="t", after_version=-1)):
            into[weights.version] = weights


async def test_a_node_client_acting_locally_with_box_actions_records_the_modules_own_as_a_server_does(
    pendulum_learner: LearnerServer,
    server_factory,
    tmp_path,
    node_client,  # noqa: F811
):
    """Pendulum-v1 in JavaScript: the file's `actions` (unsquashed to [-2, 2] and clipped) go to the env, its
    `module_actions` into the episodes, as a Python server records them; every chunk trains once."""
    await pendulum_learner.start()
    try:
        learner = pendulum_learner.learner
        server = await server_factory(learner=f"127.0.0.1:{pendulum_learner.port}")
        versions: dict[int, learner_pb2.Weights] = {}
        watching = asyncio.ensure_future(collect_weights(server, versions))
        try:
            await until(lambda: bool(versions), timeout=30)
            args = ("--mode", "local", "--env", "pendulum", "--steps", "1200", "--seed", "4")
            summary = await run_client(node_client, server.port, *args)
        finally:
            watching.cancel()
        await server.stop()
        batch_size = learner.spec.algorithm.train_batch_size
        await until(lambda: learner.intake.pending_steps < batch_size, timeout=30)  # every full batch trained
    finally:
        await pendulum_learner.stop()

    assert summary["env_steps"] == 1200 and summary["episodes"] == 6 and not any(summary["terminated"])
    assert summary["acked_batches"] == summary["batches"] and summary["unacknowledged_batches"] == 0
    assert learner.env_steps_received() == 1200 and learner.trainer.version >= 3
    assert learner.intake.rejected.total() == 0 and learner.intake.duplicates == 0 and learner.stale_steps == 0
    chunks = [c for c in read_episodes(tmp_path / "episodes") if c.id_.startswith(summary["session_id"])]
    assert sum(len(c) for c in chunks) == 1200
    checked = 0
    pendulum = gym.make("Pendulum-v1").unwrapped  # (no time limit: it steps from every recorded state)
    pendulum.reset(seed=0)
    for chunk in chunks:
        actions, obs = chunk.actions.data, chunk.observations.data
        dist_inputs = chunk.extra_model_outputs[Columns.ACTION_DIST_INPUTS].data
        logp = chunk.extra_model_outputs[Columns.ACTION_LOGP].data
        model_versions = chunk.extra_model_outputs[Columns.MODEL_VERSION].data
        assert actions.dtype == np.float32 and actions.shape == (len(obs) - 1, 1)
        # The log-probability the learner's importance ratio divides by: of the recorded action, under its inputs.
        expected = DiagGaussian.from_logits(torch.tensor(dist_inputs)).logp(torch.tensor(actions))
        np.testing.assert_allclose(logp, expected.numpy(), rtol=1e-5, atol=1e-5)
        # The env took the action unsquashed (x2 for [-2, 2]) and clipped: gymnasium's Pendulum-v1, from each
        # recorded state, steps to the next recorded observation and reward with that action.
        for t in range(len(actions)):
            pendulum.state = np.array([np.arctan2(obs[t, 1], obs[t, 0]), obs[t, 2]], np.float64)
            after, reward, *_ = pendulum.step(np.clip(2.0 * actions[t], -2.0, 2.0))
            np.testing.assert_allclose(after, obs[t + 1], rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(reward, chunk.rewards.data[t], rtol=1e-5, atol=1e-4)
        # The distribution inputs a Python server's torch path computes for the same observations with the same
        # version (its action for the noise these were drawn with is then the recorded one: mean + std * noise).
        for version in np.unique(model_versions):
            if int(version) not in versions:
                continue
            rows = model_versions == version
            weights = versions[int(version)]
            spec = spec_of(weights, "the served run spec")
            core = core_from_weights(weights, spec, ImportPolicy(spec.modules()), backend="torch")
            with torch.inference_mode():
                out = core.module.forward_exploration({Columns.OBS: torch.tensor(obs[:-1][rows])})
            np.testing.assert_allclose(dist_inputs[rows], out[Columns.ACTION_DIST_INPUTS].numpy(), atol=1e-5)
            checked += int(rows.sum())
    assert checked >= 600, checked  # (versions the client acted with that the watcher here got too)
    every = np.concatenate([c.actions.data[c.observations.lookback :] for c in chunks])
    assert (np.abs(every) > 2.0).any()  # the module's own: past the bounds, which no env action is
