"""EnvClient against a real server that refuses its streams for a while."""

from __future__ import annotations

import logging
import socket

import pytest

from rlgate.client.env_client import EnvClient
from tests.support.servers import BOX4, DISCRETE2, SpaceEnv, running_client, target, until


async def test_a_refusal_the_server_repeats_is_logged_once(server_factory, caplog: pytest.LogCaptureFixture) -> None:
    """A server waiting for its learner says UNAVAILABLE to every hello: once is enough for the client's log."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        nowhere = f"127.0.0.1:{sock.getsockname()[1]}"  # closed again: no learner answers there
    server = await server_factory(learner=nowhere)
    caplog.set_level(logging.WARNING, logger="rlgate.client.env_client")
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2), target(server), max_backoff_s=0.05)
    async with running_client(client):
        await until(lambda: client.stats.reconnects >= 5, timeout=30)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "rlgate.client.env_client"]
    assert "stream broke (UNAVAILABLE: no model yet: waiting for the learner's first weights)" in warning
