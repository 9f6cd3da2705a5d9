"""A learner that goes away and comes back: the server says so (/status, /readyz, metrics, one log line naming
the learner), keeps serving while there is room for the episodes, and picks the learner up again within 3 s
of its return."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time

import grpc
import gymnasium as gym
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.learners import ENV
from support.servers import running_client, target, until
from support.wrappers import Paced

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer

RECONNECT_S = 3.0
# A train batch the test never fills: the learner acks everything and its pacing never pauses the server.
NEVER_TRAINS = ("--spec.algorithm.train-batch-size", "1000000")


async def answering(port: int, timeout: float = 120) -> float:
    """Wait until a gRPC health check on `port` succeeds on a fresh connection; the monotonic time it did."""
    async with asyncio.timeout(timeout):
        while True:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                    return time.monotonic()
                except grpc.aio.AioRpcError:
                    pass
            await asyncio.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    "away_s",
    # 18 s: gRPC's default backoff (1 s, x1.6 per try) would next try ~26 s in, ~8 s after the learner is back
    [0, pytest.param(18, marks=pytest.mark.slow)],
    ids=lambda s: f"away_{s}s",
)
async def test_a_killed_learner_is_reported_and_a_new_one_is_picked_up_within_3_s(
    learners, server_factory, http_get, caplog, away_s
):
    caplog.set_level(logging.INFO, logger="rlgate.server.learner_link")
    first = learners.start("first", *NEVER_TRAINS)
    server = await server_factory(learner=learners.target)
    link = server.learner
    # Paced: the client steps through the whole wait for the learner, which needs steps, not a core's worth of them.
    envs = gym.vector.SyncVectorEnv([lambda: Paced(gym.make(ENV)) for _ in range(4)])
    client = EnvClient(envs, target(server), seed=0)
    async with running_client(client):
        await until(lambda: link.last_ack is not None, 120)  # episodes flow to the learner
        learner = json.loads((await http_get(server.http_port, "/status"))[1])["learner"]
        assert learner["address"] == learners.target and learner["connected"] and learner["state"] == "READY"
        assert learner["last_ack_seconds_ago"] is not None and learner["spool_max_bytes"] == 1 << 30
        assert await http_get(server.http_port, "/readyz") == (200, '{"status":"ready"}')

        first.send_signal(signal.SIGKILL)
        first.wait()
        await until(lambda: not link.connected, 30)
        code, body = await http_get(server.http_port, "/readyz")
        assert code == 200, body  # there is room for episodes: serving goes on, and /readyz says what is amiss
        reason = json.loads(body)["reason"]
        assert f"the learner at {learners.target} has been unreachable" in reason and "serving goes on" in reason
        stepped = client.stats.env_steps
        await until(lambda: client.stats.env_steps > stepped + 100, 30)
        status = json.loads((await http_get(server.http_port, "/status"))[1])
        assert not status["learner"]["connected"] and status["paused"] is None
        metrics = (await http_get(server.http_port, "/metrics"))[1]
        assert "rlgate_learner_connected 0.0" in metrics and "process_cpu_seconds_total" in metrics
        assert any(
            r.levelno == logging.WARNING and f"learner {learners.target}: unreachable" in r.getMessage()
            for r in caplog.records
        )

        await until(lambda: link.away_for() >= away_s, away_s + 10)
        learners.start("second", *NEVER_TRAINS)
        back = await answering(learners.port)
        await until(lambda: link.last_ack is not None and link.last_ack > back, 30)
        assert link.last_ack - back < RECONNECT_S, f"the server took {link.last_ack - back:.1f} s to reconnect"
        assert link.connected and link.last_error is None
    metrics = (await http_get(server.http_port, "/metrics"))[1]
    assert "rlgate_learner_connected 1.0" in metrics and "rlgate_learner_last_ack_timestamp_seconds 1." in metrics


@pytest.mark.slow
async def test_with_the_learner_away_and_sampling_paused_the_server_is_not_ready(
    learner_settings, server_factory, http_get
):
    learner = LearnerServer(learner_settings())
    await learner.start()
    port = learner.port
    try:
        server = await server_factory(learner=f"127.0.0.1:{port}", max_spool=1)  # full with any batch
        client = EnvClient(gym.make(ENV), target(server), seed=0)
        async with running_client(client):
            await until(lambda: server.learner.last_ack is not None, 60)
        await learner.stop()  # gone; the client's last episodes are in the spool
        async with running_client(EnvClient(gym.make(ENV), target(server), seed=1)):
            await until(lambda: server.learner.full() and not server.learner.connected, 30)
            code, body = await http_get(server.http_port, "/readyz")
            assert code == 503 and "and sampling is paused until it is back" in json.loads(body)["reason"]
            metrics = (await http_get(server.http_port, "/metrics"))[1]
            assert re.search(r'^rlgate_paused\{reason="[^"]+"\} 1\.0$', metrics, re.M), metrics
            assert "rlgate_spool_max_bytes 1.0" in metrics
            learner = LearnerServer(learner_settings(port=port))
            await learner.start()
            await until(lambda: not server.learner.full(), 30)
            assert (await http_get(server.http_port, "/readyz"))[0] == 200
    finally:
        await learner.stop()


@pytest.mark.slow
async def test_the_learners_pacing_is_no_stall_and_a_learner_gone_meanwhile_lets_sampling_go_on(
    learner_settings, server_factory
):
    """While the learner takes what was shipped (each update: here long, as nothing is acknowledged during one),
    sampling waits: the learner's pacing, not a stall (/status's `stalled`, the server page's warning colour).
    The learner gone meanwhile, sampling goes on while there is room (its window), then pauses: a stall."""
    slow = {"algorithm": {"train_batch_size": 64, "minibatch_size": 8, "num_epochs": 100, "overlap_sampling": False}}
    learner = LearnerServer(learner_settings(spec=slow))
    await learner.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner.port}")
        last: dict = {}

        def paused(connected: bool) -> bool:
            last.update(server.status.status())
            return last["paused"] is not None and last["learner"]["connected"] is connected

        async with running_client(EnvClient(gym.make(ENV), target(server), seed=0)):
            await until(lambda: paused(connected=True), 60)
            assert last["stalled"] is False
            steps = last["env_steps"]
            await learner.stop()
            await until(lambda: paused(connected=False), 30)
            assert last["env_steps"] > steps and last["stalled"] is True
            await server.stop()  # its paused client's last step is answered by the stop, not by the learner
    finally:
        await learner.stop()
