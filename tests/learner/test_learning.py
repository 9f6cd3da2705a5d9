"""A real learner, inference server and CartPole client in one event loop: data flows in, versions flow out."""

from __future__ import annotations

import asyncio
import json
import math
import re

import grpc
import gymnasium as gym
import numpy as np
from support.servers import DISCRETE2, SpaceEnv, running_client, target

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.learner.main import LearnerServer
from rlgate.models import build_module, load_weights
from rlgate.server.main import InferenceServer
from rlgate.spec.run import RunSpec
from rlgate.v1 import episode_pb2, learner_pb2, learner_pb2_grpc

ENV = "CartPole-v1"
DICT_ENV = "rlgate-test/DictObservations-v0"
DICT = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": gym.spaces.Discrete(3)})
gym.register(DICT_ENV, entry_point=lambda: SpaceEnv(DICT, DISCRETE2, length=9))


async def wait_for_version(server: InferenceServer, version: int, timeout: float = 30.0) -> None:
    """Until the server serves `version` or newer (bounded in time)."""
    async with asyncio.timeout(timeout):
        while server.host.core is None or server.host.core.version < version:
            await asyncio.sleep(0.01)


async def serving(learner_server: LearnerServer, server_factory) -> InferenceServer:
    """An inference server fed by `learner_server`, sampling at its pace (one train batch per version)."""
    return await server_factory(
        learner=f"127.0.0.1:{learner_server.port}",
    )


async def test_versions_advance_and_reach_the_server(learner_server, server_factory, http_get):
    server = await serving(learner_server, server_factory)
    batch_size = learner_server.learner.spec.algorithm.train_batch_size
    client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)]), target(server), seed=0)
    async with running_client(client):
        await wait_for_version(server, 3)
        assert client.stats.model_version >= 2  # actions carry the version that chose them
    learner = learner_server.learner
    status = learner.status()
    assert status["model_version"] >= 3
    assert status["env_steps_trained"] >= 3 * batch_size
    assert status["episodes"] > 0 and status["mean_return"] > 0
    assert status["module_mean_returns"] == status["agent_mean_returns"] == {}  # a single-agent run has no modules
    assert all(math.isfinite(status["last_update"][k]) for k in ("policy_loss", "vf_loss", "kl"))
    assert status["history"]["updates"] >= 3 and status["history"]["episodes"] == status["episodes"]
    # The learner paces sampling: nothing was too stale to train on.
    assert status["stale_steps"] == 0

    code, body = await http_get(learner_server.http_port, "/status")
    assert code == 200 and json.loads(body)["model_version"] >= 3
    code, metrics = await http_get(learner_server.http_port, "/metrics")
    version = re.search(r"^rlgate_learner_model_version (\S+)$", metrics, re.M)
    trained = re.search(r"^rlgate_learner_env_steps_total (\S+)$", metrics, re.M)
    assert code == 200 and version and trained
    assert float(version[1]) >= 3 and float(trained[1]) >= 3 * batch_size

    # The server's side of the hand-off: spool depth, bytes and acks are exported; after a graceful stop the
    # learner has acked every batch and the gauge is back at zero.
    code, metrics = await http_get(server.http_port, "/metrics")
    for name in ("rlgate_spool_batches", "rlgate_spooled_bytes_total", "rlgate_acked_batches_total"):
        assert re.search(rf"^{name} \S+$", metrics, re.M), name
    await server.stop()
    sample = server.metrics.registry.get_sample_value
    assert sample("rlgate_spool_batches") == len(server.learner.spool.files()) == 0
    assert sample("rlgate_acked_batches_total") == server.learner.spool.acked >= 3
    assert sample("rlgate_spooled_bytes_total") > 0


async def test_watch_weights_pushes_every_new_version_to_another_subscriber(
    learner_server, server_factory, learner_settings
):
    server = await serving(learner_server, server_factory)
    client = EnvClient(gym.make(ENV), target(server), seed=1)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel,
        running_client(client),
    ):
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        call = stub.WatchWeights(learner_pb2.WatchWeightsRequest(server_id="observer", after_version=-1))
        async with asyncio.timeout(30):
            first = await call.read()  # the current weights at once
            second = await call.read()  # then the next version when it is trained
        call.cancel()
    assert second.version > first.version >= 0
    assert second.safetensors != first.safetensors
    observation_space = codec.space_from_proto(second.observation_space)
    action_space = codec.space_from_proto(second.action_space)
    assert observation_space == gym.make(ENV).observation_space and action_space == gym.spaces.Discrete(2)
    assert RunSpec.from_json(second.spec_json, "weights") == learner_server.learner.spec  # what servers build
    module = build_module(observation_space, action_space)
    load_weights(module, second.safetensors)  # a complete, loadable model


async def test_get_status_reports_the_learners_progress(learner_server, server_factory):
    server = await serving(learner_server, server_factory)
    client = EnvClient(gym.make(ENV), target(server), seed=2)
    async with running_client(client):
        await wait_for_version(server, 2)
    await server.stop()  # every chunk shipped and acked: the learner's intake no longer changes
    learner = learner_server.learner
    async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
        status = await learner_pb2_grpc.LearnerServiceStub(channel).GetStatus(
            learner_pb2.GetStatusRequest(), timeout=10
        )
    after = learner.status()
    assert 2 <= status.model_version <= learner.trainer.version  # training may go on with what is in the intake
    assert (
        2 * learner_server.learner.spec.algorithm.train_batch_size
        <= status.env_steps_trained
        <= after["env_steps_trained"]
    )
    assert status.episodes_received > 0 and status.duplicates == 0 and status.stale_dropped == 0
    assert status.mean_return == learner.mean_return() > 0


async def test_a_learner_serving_tls_with_a_token_is_reached_verified(learner_settings, server_factory, tls_files):
    """The server's link verifies the learner's certificate (learner_tls_ca) and sends the shared token."""
    cert, key = tls_files
    learner_server = LearnerServer(learner_settings(tls_cert=cert, tls_key=key, token="s3cret"))
    await learner_server.start()
    try:
        server = await server_factory(
            learner=f"localhost:{learner_server.port}",
            learner_tls_ca=cert,
            token="s3cret",
        )
        client = EnvClient(gym.make(ENV), f"localhost:{server.port}", seed=3, token="s3cret")
        async with running_client(client):
            await wait_for_version(server, 2)  # weights came in over TLS...
        await server.stop()
        assert server.learner.spool.acked > 0 and not server.learner.spool.files()  # ...and episodes went out over it
    finally:
        await learner_server.stop()


async def test_dict_observations_flattened_and_normalised_train_version_after_version(
    learner_settings, server_factory, tmp_path
):
    """Each version boundary pauses sampling with client steps still waiting; the pause's flush must ship only
    observations the pipeline has flattened and normalised (never a raw dict), and keep the server serving."""
    spec = {"connectors": {"env_to_module": ["MeanStdFilter"]}, "sampling": {"rollout_fragment_length": 16}}
    learner_server = LearnerServer(learner_settings(env=DICT_ENV, spec=spec))
    await learner_server.start()
    try:
        server = await server_factory(
            learner=f"127.0.0.1:{learner_server.port}",
            episode_dir=tmp_path / "shipped",
        )
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(DICT_ENV) for _ in range(4)])
        async with running_client(EnvClient(envs, target(server), seed=4)):
            await wait_for_version(server, 4)
        await server.stop()
        assert learner_server.learner.status()["stale_steps"] == 0
    finally:
        await learner_server.stop()
    flat = server.host.core.env_to_module.observation_space
    assert isinstance(flat, gym.spaces.Box)
    chunks = [episode_pb2.Episode.FromString(path.read_bytes()) for path in (tmp_path / "shipped").glob("*.pb")]
    assert len(chunks) > 20
    for chunk in chunks:
        observations = episode_from_proto(chunk, flat, DISCRETE2).get_observations()
        assert observations.shape[1:] == flat.shape  # flattened, every one of them
