"""Hypothesis against a real server: hostile streams written from the wire contract alone (support/hostile.py).

Every stream ends with a status a client can act on (never INTERNAL or UNKNOWN, never a stall) whose message
names the field and fits a trailer; its session ends with it; and a well-behaved client on another stream of the
same server makes a step after every hostile stream, and never waits long during the whole run. One server per
test, shared by its examples (what one stream left behind must not harm the next).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile import multi_agent_streams, single_agent_streams
from support.servers import (
    BOX4,
    CLIENT_ERRORS,
    CONNECT,
    DISCRETE2,
    SpaceEnv,
    longest_stall,
    running_client,
    target,
    until,
    wait_for_steps,
)

from rlgate.client.env_client import EnvClient
from rlgate.server.main import InferenceServer
from rlgate.spec.run import RunSpec

# A status message names what was wrong by the message's field (or the message itself).
NAMES_A_FIELD = re.compile(
    r"\b(hello|step|close|message|obs|rewards?|terminateds?|truncateds?|infos|agents?|num_envs|client_id|module_id|"
    r"observation_space|action_space)\b"
)
# grpc's asyncio client reports this in place of the server's status when one of its writes fails as the server
# ends the stream (grpc/grpc#36066), as a client that writes ahead of the answers may see.
GRPC_CLIENT_BUG = (grpc.StatusCode.INTERNAL, "Internal error from Core")
ANSWER_TIMEOUT_S = 10.0
CARTPOLE_OBS = gym.make("CartPole-v1").observation_space
LONG_EXAMPLES = 3_000  # about a minute per test
HOSTILE = settings(
    max_examples=100,  # a few seconds; the long tests below draw LONG_EXAMPLES
    deadline=None,
    # One server for all examples, on purpose; a stream is drawn in a few ms, but a loaded machine is slower.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Served:
    server: InferenceServer
    good: EnvClient


async def play(server: InferenceServer, messages: list[bytes], pipelined: bool) -> tuple[grpc.StatusCode, str]:
    """Send the messages, reading the answer (or the end) after each, or (`pipelined`) all before reading any, as a
    client that writes ahead does; the stream's final status."""
    async with grpc.aio.insecure_channel(target(server)) as channel:
        call = channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)()
        try:
            for message in messages:
                await call.write(message)
                if not pipelined and await asyncio.wait_for(call.read(), ANSWER_TIMEOUT_S) is grpc.aio.EOF:
                    break
            else:  # every message sent (and answered): end the stream as a client would
                await call.done_writing()
            while pipelined and await asyncio.wait_for(call.read(), ANSWER_TIMEOUT_S) is not grpc.aio.EOF:
                pass
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):  # the stream ended: its status is checked below
            pass
        code = await asyncio.wait_for(call.code(), ANSWER_TIMEOUT_S)
        return code, await call.details()


async def check(served: Served, messages: list[bytes], pipelined: bool) -> None:
    server, good = served.server, served.good
    code, details = await play(server, messages, pipelined)
    if pipelined and (code, details) == GRPC_CLIENT_BUG:
        pass  # the server's own status is not known; that it was no INTERNAL is checked below
    else:
        assert code in CLIENT_ERRORS, f"{code.name}: {details}"
    if code not in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL):
        assert NAMES_A_FIELD.search(details), f"{code.name}: {details!r} names no field"
        assert len(details.encode()) <= 1100, f"{code.name}: {len(details.encode())} bytes"
    await until(lambda: len(server.service.sessions) == 1, 5)  # the hostile stream's session ended with it
    await wait_for_steps(good, good.stats.env_steps + 1, timeout=5)  # the good client is still served
    assert server.metrics.registry.get_sample_value("rlgate_rejected_total", {"code": "INTERNAL"}) is None


@asynccontextmanager
async def beside(server: InferenceServer, good: EnvClient) -> AsyncIterator[Served]:
    """The good client running beside the hostile streams; on exit: it never waited long for an answer, and once
    it has stopped no session is left."""
    async with running_client(good):
        await wait_for_steps(good, 5)
        done = asyncio.Event()
        stall = asyncio.create_task(longest_stall(good, done))
        try:
            yield Served(server, good)
        finally:
            done.set()
        assert await stall < 5.0, "the good client stalled"
    await until(lambda: not server.service.sessions, 5)


@pytest.fixture
async def single_agent(server_factory) -> AsyncIterator[Served]:
    server = await server_factory()
    async with beside(server, EnvClient(SpaceEnv(BOX4, DISCRETE2, length=20), target(server), seed=0)) as served:
        yield served


@pytest.fixture
async def multi_agent(server_factory, examples_importable) -> AsyncIterator[Served]:
    pytest.importorskip("pettingzoo")
    from examples.multi_agent_cartpole import MultiAgentCartPole

    spec = {
        "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole"},
        "multi_agent": {"policy_mapping_fn": "per_agent"},
    }
    server = await server_factory(spec=RunSpec.parse(spec, "test"))
    async with beside(server, EnvClient([MultiAgentCartPole()], target(server), seed=0)) as served:
        yield served


SINGLE_AGENT = single_agent_streams(BOX4, DISCRETE2)
MULTI_AGENT = multi_agent_streams({agent: (CARTPOLE_OBS, DISCRETE2) for agent in ("agent_0", "agent_1")})


@HOSTILE
@given(messages=SINGLE_AGENT, pipelined=st.booleans())
async def test_hostile_single_agent_streams_get_a_client_error_and_spare_the_others(single_agent, messages, pipelined):
    await check(single_agent, messages, pipelined)


@HOSTILE
@given(messages=MULTI_AGENT, pipelined=st.booleans())
async def test_hostile_multi_agent_streams_get_a_client_error_and_spare_the_others(multi_agent, messages, pipelined):
    await check(multi_agent, messages, pipelined)


@pytest.mark.long
@pytest.mark.timeout(600)
@settings(HOSTILE, max_examples=LONG_EXAMPLES)
@given(messages=SINGLE_AGENT, pipelined=st.booleans())
async def test_many_hostile_single_agent_streams(single_agent, messages, pipelined):
    await check(single_agent, messages, pipelined)


@pytest.mark.long
@pytest.mark.timeout(600)
@settings(HOSTILE, max_examples=LONG_EXAMPLES)
@given(messages=MULTI_AGENT, pipelined=st.booleans())
async def test_many_hostile_multi_agent_streams(multi_agent, messages, pipelined):
    await check(multi_agent, messages, pipelined)
