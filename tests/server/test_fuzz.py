"""Fuzz: seeded mutations of valid streams (tests/support/mutator.py) against a real server.

Every message is answered or ends its stream with a client-error status (never INTERNAL or UNKNOWN,
never a stall), while a well-behaved client steps on beside the whole time and a fresh one works after.
Two served models: a flat Box observation, and nested ones of every kind of space. A failure names
the seed, the spaces and the case index: `Mutator(seed, *SPACES[name]).case(index)` replays it.
"""

from __future__ import annotations

import asyncio
import os

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support.mutator import MUTATIONS, Mutator
from support.servers import (
    BOX4,
    CLIENT_ERRORS,
    CONNECT,
    DISCRETE2,
    SpaceEnv,
    longest_stall,
    running_client,
    target,
    wait_for_steps,
)

from rlgate.client.env_client import EnvClient

SEED = int(os.environ.get("RLGATE_FUZZ_SEED", "18"))
# name -> (observation space, action space) of the served model
SPACES = {
    "box": (BOX4, DISCRETE2),
    "nested": (
        gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": gym.spaces.Discrete(3),
                "more": gym.spaces.Tuple([gym.spaces.MultiBinary(3), gym.spaces.MultiDiscrete([3, 4])]),
                "count": gym.spaces.Box(0, 10, (1,), np.int64),
            }
        ),
        gym.spaces.MultiDiscrete([2, 3]),
    ),
}
CONCURRENT_STREAMS = 32
ANSWER_TIMEOUT_S = 10.0


async def play(channel: grpc.aio.Channel, messages: list[bytes]) -> tuple[int, grpc.StatusCode, str]:
    """Send the messages, reading the answer (or the end) after each; (messages sent, final status, details)."""
    call = channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)()
    sent = 0
    for message in messages:
        if call.done():
            break
        try:
            await call.write(message)
        except grpc.aio.AioRpcError:
            break
        sent += 1
        try:
            if await asyncio.wait_for(call.read(), ANSWER_TIMEOUT_S) is grpc.aio.EOF:
                break
        except grpc.aio.AioRpcError:  # the stream ended with an error: its status is checked below
            break
    else:  # every message answered: end the stream as a client would
        await call.done_writing()
    code = await asyncio.wait_for(call.code(), ANSWER_TIMEOUT_S)
    return sent, code, await call.details()


def replay(spaces: str, index: int, name: str) -> str:
    return f"case {index} ({name}; replay: Mutator({SEED}, *SPACES[{spaces!r}]).case({index}))"


async def fuzz(server, spaces: str, cases: int) -> dict[str, int]:
    """Play `cases` cases, CONCURRENT_STREAMS at a time; how many mutants of each kind reached the server."""
    mutator = Mutator(SEED, *SPACES[spaces])
    indices = iter(range(cases))
    sent_by_mutation: dict[str, int] = {}

    async def worker() -> None:
        async with grpc.aio.insecure_channel(target(server)) as channel:
            for index in indices:
                name, messages, position = mutator.case(index)
                try:
                    sent, code, details = await play(channel, messages)
                except TimeoutError:
                    pytest.fail(f"{replay(spaces, index, name)}: no answer in {ANSWER_TIMEOUT_S} s")
                assert code in CLIENT_ERRORS, f"{replay(spaces, index, name)}: {code.name}: {details}"
                assert code == grpc.StatusCode.OK or details, f"{replay(spaces, index, name)}: {code.name}, no details"
                sent_by_mutation[name] = sent_by_mutation.get(name, 0) + (sent > position)

    await asyncio.gather(*(worker() for _ in range(CONCURRENT_STREAMS)))
    return sent_by_mutation


async def check_fuzz(server_factory, spaces: str, cases: int) -> None:
    server = await server_factory()
    good = EnvClient(SpaceEnv(*SPACES[spaces], length=50), target(server), seed=0)
    async with running_client(good):
        await wait_for_steps(good, 5)
        done = asyncio.Event()
        stall = asyncio.create_task(longest_stall(good, done))
        try:
            sent = await fuzz(server, spaces, cases)
        finally:
            done.set()
        assert await stall < 5.0, "the good client stalled during the fuzz"
    assert sum(sent.values()) == cases and set(sent) == {name for name, _, _ in MUTATIONS}, sent  # every mutant arrived
    internal = server.metrics.registry.get_sample_value("rlgate_rejected_total", {"code": "INTERNAL"})
    assert internal is None, f"{internal} INTERNAL"
    fresh = EnvClient(SpaceEnv(*SPACES[spaces]), target(server), seed=1)
    assert (await fresh.run(max_steps=20)).env_steps == 20


# numpy's RuntimeWarnings (a cast that wraps, an overflow) raise: in the server they end as INTERNAL, and fail.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("spaces", SPACES)
@pytest.mark.slow
async def test_a_thousand_mutated_messages_get_client_errors_only(server_factory, spaces):
    await check_fuzz(server_factory, spaces, 1_000)


@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("spaces", SPACES)
async def test_ten_thousand_mutated_messages_get_client_errors_only(server_factory, spaces):
    """10,000 in all: 5,000 against each served model."""
    await check_fuzz(server_factory, spaces, 10_000 // len(SPACES))
