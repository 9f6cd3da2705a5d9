"""Bad input: each gets its exact status code while a well-behaved client on the same server steps on."""

from __future__ import annotations

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support.servers import BOX4, DISCRETE2, RawStream, SpaceEnv, hello, running_client, step, target, wait_for_steps

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.v1 import policy_pb2 as pb
from rlgate.v1 import tensor_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
GOOD_OBS = np.zeros((1, 4), np.float32)

# name -> (messages after which the server must end the stream, expected code, words in the message)
CASES = {
    "wrong obs shape": (
        [hello(), step(np.zeros((1, 3), np.float32))],
        INVALID,
        "obs: shape (1, 3) != (1, 4)",
    ),
    "wrong dtype": ([hello(), step(np.zeros((1, 4), np.float64))], INVALID, "obs: dtype float64 != float32"),
    "NaN in a Box obs": (
        [hello(), step(np.array([[0, np.nan, 0, 0]], np.float32))],
        INVALID,
        "obs: NaN at index",
    ),
    "wrong number of sub-envs": ([hello(num_envs=2), step(GOOD_OBS)], INVALID, "obs: shape (1, 4) != (2, 4)"),
    "wrong reward shape": (
        [hello(), step(GOOD_OBS, reward=np.zeros(2))],
        INVALID,
        "reward: shape (2,) != (1,)",
    ),
    "NaN reward": ([hello(), step(GOOD_OBS, reward=np.array([np.nan]))], INVALID, "reward: NaN"),
    "step before hello": ([step(GOOD_OBS)], PRECONDITION, "step before hello"),
    "step after close": (
        [hello(), step(GOOD_OBS), pb.ClientMessage(close=pb.Close()), step(GOOD_OBS)],
        PRECONDITION,
        "step after close",
    ),
    "hello twice": ([hello(), hello()], PRECONDITION, "hello sent twice"),
    "empty message": ([pb.ClientMessage()], INVALID, "empty message"),
    "bytes that are not a message": ([b"\xff\xff\xff\xff"], INVALID, "not a valid rlgate.v1.ClientMessage"),
    "missing obs": ([hello(), pb.ClientMessage(step=pb.Step())], INVALID, "obs: missing"),
    "zero sub-envs": ([hello(num_envs=0)], INVALID, "num_envs must be at least 1"),
    "too many sub-envs": ([hello(num_envs=5000)], grpc.StatusCode.RESOURCE_EXHAUSTED, "max_envs_per_session"),
    "malformed space": (
        [
            pb.ClientMessage(
                hello=pb.Hello(
                    num_envs=1, observation_space=tensor_pb2.Space(), action_space=codec.space_to_proto(DISCRETE2)
                )
            )
        ],
        INVALID,
        "hello.observation_space: missing space",
    ),
    "unknown module": (
        [
            pb.ClientMessage(
                hello=pb.Hello(
                    num_envs=1,
                    module_id="nope",
                    observation_space=codec.space_to_proto(BOX4),
                    action_space=codec.space_to_proto(DISCRETE2),
                )
            )
        ],
        grpc.StatusCode.NOT_FOUND,
        "unknown module_id 'nope'",
    ),
    "oversized message": ([hello(), b"\x12" + b"\x00" * (2 << 20)], grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
}


@pytest.mark.parametrize("case", CASES)
async def test_bad_input_gets_its_status_and_spares_other_clients(server_factory, case):
    server = await server_factory(max_message_bytes=1 << 20)
    good = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10**6), target(server), seed=0)
    messages, code, words = CASES[case]
    async with running_client(good):
        await wait_for_steps(good, 5)
        raw = RawStream(server)
        try:
            for message in messages:
                await raw.send(message)
                if isinstance(message, pb.ClientMessage) and message.WhichOneof("kind") in ("hello", "step"):
                    try:
                        await raw.recv()
                    except grpc.aio.AioRpcError:
                        break  # the server ended the stream: its status is checked below
            status, details = await raw.status()
        finally:
            await raw.close()
        assert status == code, details
        assert words in details
        before = good.stats.env_steps
        await wait_for_steps(good, before + 20)  # the good client never noticed
    if case != "oversized message":  # gRPC itself refuses those, before any handler of ours runs
        assert server.metrics.registry.get_sample_value("rlgate_rejected_total", {"code": code.name}) >= 1


async def test_discrete_obs_out_of_range_is_invalid_argument(server_factory):
    server = await server_factory()
    raw = RawStream(server)
    try:
        await raw.send(hello(observation_space=gym.spaces.Discrete(3)))
        assert (await raw.recv()).WhichOneof("kind") == "welcome"
        await raw.send(step(np.array([7])))
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == INVALID and details == "obs: value at index (0,) outside Discrete(3)"


async def test_a_client_with_other_spaces_is_told_both(server):
    good = EnvClient(SpaceEnv(BOX4, DISCRETE2), target(server), seed=0)
    await good.run(max_steps=3)
    raw = RawStream(server)
    try:
        await raw.send(hello(action_space=gym.spaces.Discrete(3)))
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == PRECONDITION
    assert "Discrete(2)" in details and "Discrete(3)" in details


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", "secret"),)])
async def test_missing_or_wrong_token_is_unauthenticated(server_factory, metadata):
    server = await server_factory(token="secret")
    raw = RawStream(server, metadata=metadata)
    try:
        await raw.send(hello())
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in details
    client = EnvClient(SpaceEnv(BOX4, DISCRETE2), target(server), token="secret", seed=0)
    assert (await client.run(max_steps=5)).env_steps == 5


async def test_too_many_sessions_is_resource_exhausted(server_factory):
    server = await server_factory(max_sessions=1)
    good = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10**6), target(server), seed=0)
    async with running_client(good):
        await wait_for_steps(good, 3)
        raw = RawStream(server)
        try:
            await raw.send(hello())
            status, details = await raw.status()
        finally:
            await raw.close()
        assert status == grpc.StatusCode.RESOURCE_EXHAUSTED and "1 sessions open" in details
