"""Local-inference env clients (`EnvClient(..., inference="local")`) against a real server and learner in one event
loop: they act with the weights the server relays, their episodes reach the learner through the server's spool and
train it, alone or beside server-side sessions; their connector statistics are merged as a server's are; what the
server cannot serve them ends their run with a message saying why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.servers import running_client, target, until

from rlgate.client.connection import ServerRefused
from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.core.errors import UserError
from rlgate.learner.main import LearnerServer
from rlgate.server.main import InferenceServer
from rlgate.spec.run import RunSpec
from rlgate.v1 import episode_pb2

ENV = "CartPole-v1"


def cartpoles(n: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(n)])


def local_client(server: InferenceServer, spool: Path, n: int = 4, **kwargs) -> EnvClient:
    return EnvClient(cartpoles(n), target(server), inference="local", spool_dir=spool, **kwargs)


def served(server: InferenceServer) -> int:
    return server.host.core.version if server.host.core else -1


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
async def test_a_local_client_trains_the_learner_through_its_server(
    learner_server: LearnerServer, server_factory, tmp_path, backend
):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
    client = local_client(server, tmp_path / "client-spool", seed=0, backend=backend)
    async with running_client(client):
        await until(lambda: served(server) >= 4, timeout=60)
        # Newer versions are acted with as they come (onnxruntime: once their sessions are built, between steps).
        await until(lambda: client.stats.model_version >= 3, timeout=30)
    assert client.stats.backend == backend
    await server.stop()  # the client's spool was drained into the server's, which drains into the learner
    learner = learner_server.learner
    assert server.service.env_steps == 0  # no step went through a session: the client acted itself
    assert server.local.env_steps > 0 and not list((tmp_path / "client-spool").rglob("*.pb"))
    assert not list((tmp_path / "spool").rglob("*.pb"))
    # Every step the client shipped reached the learner, once (the client's last cut-off chunks too).
    assert learner.env_steps_received() == server.local.env_steps
    assert learner.intake.duplicates == 0 and learner.stale_steps == 0
    updates = learner.progress.updates.page(0)["rows"]
    assert {update["train_steps"] for update in updates} == {learner.spec.algorithm.train_batch_size}
    # Recorded as a server records: log-probabilities and the versions that chose the steps, which PPO checks.
    assert all(update["staleness"] < 3 for update in updates)


async def test_a_mixed_fleet_trains_one_learner_and_the_server_shows_its_local_clients(
    learner_server: LearnerServer, server_factory, tmp_path, http_get
):
    server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", server_id="mixed")
    remote = EnvClient(cartpoles(4), target(server), seed=1)
    local = local_client(server, tmp_path / "client-spool", seed=2, client_id="local-one")
    async with running_client(remote), running_client(local):
        await until(lambda: served(server) >= 4 and local.stats.env_steps > 0 and remote.stats.env_steps > 0, 60)
        await until(lambda: server.local.clients and server.status.status()["local_clients"]["env_steps"] > 0, 30)
        status = server.status.status()
        code, metrics = await http_get(server.http_port, "/metrics")
        await until(lambda: any(s["local_clients"] for s in learner_server.learner.servers.connected()), 10)
        (reported,) = learner_server.learner.servers.connected()
    local_status = status["local_clients"]
    assert local_status["watching_weights"] == local_status["sending_episodes"] == 1
    (shown,) = local_status["clients"]
    assert shown["client_id"] == "local-one" and shown["num_envs"] == 4 and shown["env_steps"] > 0
    assert 0 <= shown["model_version"] <= status["model_version"] and 0 <= shown["staleness"] <= 2
    assert code == 200 and "rlgate_local_clients 1.0" in metrics and "rlgate_local_env_steps_total" in metrics
    assert reported["id"] == "mixed" and reported["local_clients"] == 1 and reported["sessions"] == 1
    assert reported["local_env_steps"] > 0 and reported["env_steps"] > 0
    await server.stop()
    learner = learner_server.learner
    # The learner took in both kinds of steps: more than either sent alone.
    assert learner.env_steps_received() > max(server.local.env_steps, server.service.env_steps // 2)
    assert learner.intake.duplicates == 0 and learner.stale_steps == 0


def filter_count(state: dict) -> int:
    return int(state["MeanStdFilter"]["global"][0]["count"])


async def test_local_clients_statistics_are_merged_by_the_learner(learner_settings, server_factory, tmp_path):
    learner = LearnerServer(learner_settings(spec={"connectors": {"env_to_module": ["MeanStdFilter"]}}))
    await learner.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner.port}")
        clients = [local_client(server, tmp_path / "spool-clients", 2, seed=10 * i) for i in range(2)]
        await asyncio.wait_for(asyncio.gather(*(c.run(max_steps=600) for c in clients)), 60)
        await server.stop()
        merged = filter_count(learner.learner.connectors.get_state())
        # Each client filters the observations it acts on (a reset one too, and its last one): the learner holds
        # both clients' statistics, which the server itself never saw (it acted on nothing).
        seen = [c.stats.env_steps + c.stats.episodes + c.env.num_envs for c in clients]
        assert max(c.stats.env_steps for c in clients) < merged <= sum(seen)
        assert server.service.env_steps == 0
    finally:
        await learner.stop()


async def test_a_server_without_a_learner_serves_its_own_policy_and_keeps_the_episodes_in_its_files(
    server_factory, tmp_path
):
    server = await server_factory(env=ENV)  # a fresh model; episode files, no learner
    client = local_client(server, tmp_path / "client-spool", seed=3)
    stats = await asyncio.wait_for(client.run(max_steps=300), 30)
    assert stats.env_steps >= 300 and stats.model_version == 0
    await server.stop()
    files = list((tmp_path / "episodes").glob("*.pb"))
    metadata = json.loads((tmp_path / "episodes" / "metadata.json").read_text())
    assert files and metadata["env_id"] == ENV
    assert server.local.env_steps == server.metrics.registry.get_sample_value("rlgate_local_env_steps_total") > 0


async def test_an_evaluating_local_client_sends_nothing_to_a_server_that_keeps_no_episodes(server_factory, tmp_path):
    server = await server_factory(env=ENV, episode_dir=None)
    greedy = local_client(server, tmp_path / "client-spool", explore=False, seed=4)
    stats = await asyncio.wait_for(greedy.run(max_steps=200), 30)
    assert stats.env_steps >= 200 and not (tmp_path / "client-spool").exists()
    exploring = local_client(server, tmp_path / "client-spool", seed=5)
    with pytest.raises(ServerRefused, match="FAILED_PRECONDITION: this server keeps no episodes"):
        await asyncio.wait_for(exploring.run(max_steps=10_000), 30)


async def test_what_a_local_client_cannot_act_with_ends_its_run_with_a_message(
    server_factory, tmp_path, examples_importable
):
    server = await server_factory(env=ENV)
    other_spaces = EnvClient(gym.make("Acrobot-v1"), target(server), inference="local", spool_dir=tmp_path / "s")
    with pytest.raises(UserError, match=r"the env's spaces must equal those of the model .* observation_space"):
        await asyncio.wait_for(other_spaces.run(max_steps=10), 30)
    examples = RunSpec.load(Path(__file__).parents[2] / "examples" / "prev_reward.toml")
    user_code = await server_factory(spec=examples, allow_import=["examples"], episode_dir=None)
    not_allowed = local_client(user_code, tmp_path / "s", explore=False)
    with pytest.raises(UserError, match=r"which this process may not import .*--allow-import examples"):
        await asyncio.wait_for(not_allowed.run(max_steps=10), 30)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
async def test_a_local_client_records_the_episodes_a_server_records_for_the_same_actions(
    server_factory, tmp_path, backend
):
    """The same CartPoles (seeded), the same policy and the same random draws (torch's generator seeded alike: the
    server's for its sessions, the client's where it acts itself; onnxruntime's graph takes its noise from it too):
    the chunks acting locally ships are those a server with the same backend records acting for the client, column
    for column, cut at the same steps."""
    recorded = {}
    for inference in ("server", "local"):
        recorded[inference] = await recorded_chunks(server_factory, tmp_path / inference, inference, backend)
    assert recorded["local"] == recorded["server"] and len(recorded["server"]) > 10


async def test_a_local_client_acting_in_onnxruntime_records_what_it_records_acting_in_torch(server_factory, tmp_path):
    """One seeded client acting in onnxruntime (--backend auto), one in torch (its default): the same actions and
    steps, and log-probabilities and action distribution inputs equal to float tolerance (the graph's float
    arithmetic is not torch's, bit for bit)."""
    recorded = {
        backend: await recorded_chunks(server_factory, tmp_path / backend, "local", backend, decoded=True)
        for backend in ("auto", "torch")
    }
    onnx, torch_ = recorded["auto"], recorded["torch"]
    assert len(onnx) == len(torch_) > 10
    for ours, theirs in zip(onnx, torch_, strict=True):
        assert ours[:-1] == theirs[:-1]  # where it starts, its steps, observations, actions, rewards, versions
        assert ours[-1].keys() == theirs[-1].keys() >= {Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS}
        for column, value in ours[-1].items():
            np.testing.assert_allclose(value, theirs[-1][column], rtol=1e-5, atol=1e-6, err_msg=column)


async def recorded_chunks(server_factory, directory: Path, inference: str, backend: str, decoded: bool = False):
    """The chunks a seeded client of 3 CartPoles ships in 400 steps (`chunks_by_step`) acting as `inference` says,
    the server's or its own forward pass in `backend`."""
    episodes = directory / "episodes"
    server = await server_factory(env=ENV, episode_dir=episodes, seed=7, backend=backend)
    client = EnvClient(
        cartpoles(3), target(server), seed=7, inference=inference, spool_dir=directory / "spool", backend=backend
    )
    try:
        await asyncio.wait_for(client.run(max_steps=400), 30)
    finally:
        await server.stop()
    if inference == "local":
        assert client.stats.backend == backend.replace("auto", "onnxruntime")
    return chunks_by_step(episodes, decoded)


def chunks_by_step(directory: Path, decoded: bool = False) -> list[tuple]:
    """The chunks in an episode directory, each as its data without its episode id, in order of where it starts;
    `decoded`: the model's extra outputs as arrays by column (else as their wire bytes)."""
    found = []
    for path in directory.glob("*.pb"):
        chunk = episode_pb2.Episode.FromString(path.read_bytes())
        columns = [chunk.observations, chunk.actions, chunk.rewards, chunk.model_versions]
        extra = chunk.extra_model_outputs.items()
        if decoded:
            outputs: Any = {key: codec.from_value(value) for key, value in extra}
        else:
            outputs = tuple(sorted((key, value.SerializeToString()) for key, value in extra))
        found.append(
            (
                chunk.t_started,
                chunk.chunk_index,
                chunk.terminated,
                chunk.truncated,
                chunk.len_lookback_buffer,
                *(column.SerializeToString() for column in columns),
                outputs,
            )
        )
    return sorted(found, key=lambda chunk: chunk[:-1])
