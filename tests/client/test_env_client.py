"""EnvClient against a real server that refuses its streams for a while."""

from __future__ import annotations

import logging
import socket

import pytest

from rlgate.client.env_client import EnvClient
from tests.support.servers import BOX4, DISCRETE2, SpaceEnv, running_client, target, until


async def test_a_server_without_a_model_yet_is_start_up_said_once_at_info(
    server_factory, caplog: pytest.LogCaptureFixture
) -> None:
    """A server waiting for its learner says UNAVAILABLE to every hello: what every run meets as it starts, said
    once and not as a warning."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        nowhere = f"127.0.0.1:{sock.getsockname()[1]}"  # closed again: no learner answers there
    server = await server_factory(learner=nowhere)
    caplog.set_level(logging.INFO, logger="rlgate.client.env_client")
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2), target(server), max_backoff_s=0.05)
    async with running_client(client):
        await until(lambda: client.stats.reconnects >= 5, timeout=30)
    (record,) = [r for r in caplog.records if r.name == "rlgate.client.env_client"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "waiting for the server's model (UNAVAILABLE: no model yet: waiting for the learner's first weights)"
    )


async def test_a_stream_that_breaks_mid_run_is_a_warning(server_factory, caplog: pytest.LogCaptureFixture) -> None:
    # A fresh model for the first client's spaces (serves at once); no drain and an episode that never ends: the
    # stop ends the stream mid-episode instead of handing the client over at its episode's end (with 5-step
    # episodes, one ended while a loaded machine stopped the server, and the client was handed over).
    server = await server_factory(drain_timeout_s=0)
    caplog.set_level(logging.INFO, logger="rlgate.client.env_client")
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10**9), target(server), max_backoff_s=0.05)
    async with running_client(client):
        await until(lambda: client.stats.env_steps > 0, timeout=30)
        await server.stop()  # the stream ends under the client
        await until(lambda: client.stats.reconnects >= 1, timeout=30)
    (record, *_) = [r for r in caplog.records if r.name == "rlgate.client.env_client"]
    assert record.levelno == logging.WARNING and record.getMessage().startswith("stream broke ("), record.getMessage()


async def test_a_multi_agent_episodes_return_sums_its_agents_rewards(server_factory) -> None:
    """Two agents paid 1 per step for 10 steps: each episode returns 20 (RLlib's episode return, as the
    learner counts it), not one return of 10 per agent."""
    pytest.importorskip("pettingzoo")
    from rlgate.spec.run import RunSpec
    from tests.support.bad_agent_envs import ParallelSteps

    server = await server_factory(spec=RunSpec.parse({"multi_agent": {"policy_mapping_fn": "shared"}}, "test"))
    client = EnvClient([ParallelSteps(), ParallelSteps()], target(server))
    async with running_client(client):
        await until(lambda: client.stats.episodes >= 4, timeout=30)
    assert client.stats.episodes == len(client.stats.returns) and set(client.stats.returns) == {20.0}
