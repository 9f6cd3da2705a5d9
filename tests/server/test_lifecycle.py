"""Sessions that end badly, servers that restart or stop, and the HTTP side."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
from support.servers import (
    BOX4,
    DISCRETE2,
    RawStream,
    SpaceEnv,
    hello,
    running_client,
    shipped,
    step,
    target,
    wait_for_steps,
)
from support.stalled_client import stalled_stream

from rlgate.client.env_client import EnvClient
from rlgate.server.main import LAST_MESSAGE_S
from rlgate.spec.run import RunSpec, SamplingSpec


async def test_a_client_that_disconnects_mid_episode_has_its_episode_shipped_truncated(server, tmp_path):
    raw = RawStream(server)
    await raw.send(hello())
    await raw.recv()
    for _ in range(3):
        await raw.send(step(np.zeros((1, 4), np.float32)))
        await raw.recv()
    await raw.close()  # no close message: the connection just goes away
    async with asyncio.timeout(10):
        while server.service.sessions:
            await asyncio.sleep(0.01)
    await server.stop()
    (episode,) = shipped(tmp_path / "episodes")
    assert episode.truncated and not episode.terminated
    assert episode.rewards.shape == [2]  # reset + two steps whose action outcomes arrived


async def test_an_idle_session_is_closed_and_its_episode_shipped(server_factory, tmp_path):
    server = await server_factory(idle_timeout_s=0.3)
    raw = RawStream(server)
    try:
        await raw.send(hello())
        await raw.recv()
        await raw.send(step(np.zeros((1, 4), np.float32)))
        await raw.recv()
        await raw.send(step(np.ones((1, 4), np.float32) / 2))
        await raw.recv()
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == grpc.StatusCode.DEADLINE_EXCEEDED and "no message for 0.3 s" in details
    await server.stop()
    (episode,) = shipped(tmp_path / "episodes")
    assert episode.truncated


async def test_a_client_that_takes_no_answers_is_closed_after_the_idle_timeout(server_factory, tmp_path):
    """A client that reads no answers leaves the server's write waiting for ever (HTTP/2 flow control): its
    session held its slot and episodes until the server stopped, whatever the idle timeout."""
    server = await server_factory(idle_timeout_s=0.3)
    messages = [hello(), *(step(np.full((1, 4), i / 100, np.float32)) for i in range(50))]
    # Room for the welcome and a few answers, not for 50.
    async with stalled_stream(server.port, [m.SerializeToString() for m in messages], window=200):
        async with asyncio.timeout(10):
            while not server.service.sessions:
                await asyncio.sleep(0.01)
            while server.service.sessions:
                await asyncio.sleep(0.01)
    assert server.metrics.registry.get_sample_value("rlgate_rejected_total", {"code": "DEADLINE_EXCEEDED"}) == 1
    await server.stop()
    (episode,) = shipped(tmp_path / "episodes")
    assert episode.truncated and 1 <= episode.rewards.shape[0] < 49


async def test_long_episodes_are_cut_into_chunks_with_lookback(server_factory, tmp_path):
    sampling = SamplingSpec(rollout_fragment_length=4, episode_lookback_horizon=1)
    server = await server_factory(spec=RunSpec(sampling=sampling))
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10), target(server), seed=0)
    await client.run(max_steps=10)
    await server.stop()
    chunks = sorted(shipped(tmp_path / "episodes"), key=lambda e: e.chunk_index)
    assert [c.chunk_index for c in chunks] == [0, 1, 2]
    assert len({c.id for c in chunks}) == 1
    assert [c.rewards.shape[0] - c.len_lookback_buffer for c in chunks] == [4, 4, 2]
    assert [c.len_lookback_buffer for c in chunks] == [0, 1, 1]
    assert chunks[-1].terminated and not chunks[0].terminated


async def test_clients_reconnect_on_their_own_after_a_server_restart(server_factory):
    """An episode that never ends is not handed over: once the stopping server's drain timeout passes, its stream ends
    UNAVAILABLE at its next message (the episode cut), the stop returns, and the client reconnects by itself."""
    first = await server_factory(drain_timeout_s=0.5)
    port = first.port
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10**6), f"127.0.0.1:{port}", seed=0, max_backoff_s=0.2)
    async with running_client(client):
        await wait_for_steps(client, 10)
        await asyncio.wait_for(first.stop(), 0.5 + LAST_MESSAGE_S + 3)
        assert client.stats.handovers == 0
        second = await server_factory(port=port)
        reached = client.stats.env_steps
        await wait_for_steps(client, reached + 20)
        assert client.stats.reconnects >= 1
        assert len(second.service.sessions) == 1


async def test_http_endpoints_report_health_status_and_metrics(server, http_get):
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=5), target(server), seed=0)
    await client.run(max_steps=20)
    assert await http_get(server.http_port, "/healthz") == (200, '{"status":"ok"}')
    assert (await http_get(server.http_port, "/readyz"))[0] == 200
    status = json.loads((await http_get(server.http_port, "/status"))[1])
    assert status["model_version"] == 0 and status["sessions"] == 0
    code, text = await http_get(server.http_port, "/metrics")
    assert code == 200
    assert "rlgate_env_steps_total 20.0" in text
    assert 'rlgate_episodes_total{end="terminated"} 4.0' in text
    for name in (
        "rlgate_sessions",
        "rlgate_batch_size_bucket",
        "rlgate_forward_seconds_bucket",
        "rlgate_step_latency_seconds_bucket",
        "rlgate_model_version",
        "rlgate_stage_seconds_total",
    ):
        assert name in text


async def test_grpc_health_and_reflection_are_on(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(target(server)) as channel:
        check = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlgate.v1.PolicyService")
        )
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        services = [s.name async for r in stream for s in r.list_services_response.service]
    assert "rlgate.v1.PolicyService" in services


def test_tls_and_token_together(tls_files):
    cert, key = tls_files

    async def scenario() -> None:
        from rlgate.server.main import InferenceServer
        from rlgate.server.settings import ServerSettings

        server = InferenceServer(
            ServerSettings(
                host="127.0.0.1",
                port=0,
                http_port=0,
                tls_cert=cert,
                tls_key=key,
                token="t0k",
                drain_timeout_s=1,
            )
        )
        await server.start()
        try:
            client = EnvClient(SpaceEnv(BOX4, DISCRETE2), f"localhost:{server.port}", tls_ca=cert, token="t0k", seed=0)
            assert (await asyncio.wait_for(client.run(max_steps=5), 20)).env_steps == 5
            plain = EnvClient(
                SpaceEnv(BOX4, DISCRETE2), f"localhost:{server.port}", token="t0k", seed=0, max_backoff_s=0.05
            )
            with pytest.raises(asyncio.TimeoutError):  # a plaintext client never gets through a TLS port
                await asyncio.wait_for(plain.run(max_steps=5), 1.0)
        finally:
            await server.stop()

    asyncio.run(scenario())


@pytest.mark.slow
def test_sigterm_drains_flushes_and_exits_zero(tmp_path):
    """`rlgate serve` as a real process: SIGTERM hands the open session over at its episode's end (nothing cut),
    ships the episodes, exits 0."""
    episodes = tmp_path / "episodes"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlgate",
            "serve",
            "--port",
            "0",
            "--http-port",
            "0",
            "--episode-dir",
            str(episodes),
            "--env",
            "CartPole-v1",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        port = None
        for _ in range(200):
            line = process.stderr.readline()
            if match := re.search(r"serving grpc=[\d.]+:(\d+)", line):
                port = int(match.group(1))
                break
        assert port, "server did not report its port"

        async def scenario() -> int:
            import gymnasium as gym

            client = EnvClient(gym.make("CartPole-v1"), f"127.0.0.1:{port}", seed=0, max_backoff_s=0.05)
            async with asyncio.timeout(20):
                task = asyncio.create_task(client.run())
                await wait_for_steps(client, 30)
                process.send_signal(signal.SIGTERM)
                while client.stats.handovers == 0:  # told to reconnect at its episode's end
                    await asyncio.sleep(0.01)
                client.stop()
                await task
            return client.stats.env_steps

        asyncio.run(scenario())
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    messages = shipped(episodes)
    assert messages, "the episodes were not flushed on SIGTERM"
    assert not any(m.session_closed for m in messages)  # the episode running at SIGTERM ran to its end
