"""Bad input: each gets its exact status code while a well-behaved client on the same server steps on."""

from __future__ import annotations

import logging
import re

import grpc
import gymnasium as gym
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

from rlgate.client.env_client import EnvClient, hello_message
from rlgate.core import codec
from rlgate.server.policy_service import MAX_CLIENT_ID
from rlgate.spec.run import RunSpec
from rlgate.v1 import policy_pb2 as pb
from rlgate.v1 import tensor_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
GOOD_OBS = np.zeros((1, 4), np.float32)
# A shape numpy refuses to make whatever the data (issue 18, item 3).
HUGE = tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[0, 2**62], data=b"")

# name -> (messages after which the server must end the stream, expected code, words in the message)
CASES = {
    "wrong obs shape": (
        [hello(), step(np.zeros((1, 3), np.float32))],
        INVALID,
        "obs: shape (1, 3) != (1, 4)",
    ),
    "integer obs for a float Box": (
        [hello(), step(np.zeros((1, 4), np.int32))],
        INVALID,
        "obs: dtype int32 does not fit Box of float32 (send a float)",
    ),
    "obs shape that numpy cannot make": (
        [hello(), pb.ClientMessage(step=pb.Step(obs=tensor_pb2.Value(tensor=HUGE)))],
        INVALID,
        "obs: shape (0, 4611686018427387904) != (1, 4)",
    ),
    "reward shape that numpy cannot make": (
        [hello(), pb.ClientMessage(step=pb.Step(obs=codec.to_value(GOOD_OBS), reward=HUGE))],
        INVALID,
        "reward: shape (0, 4611686018427387904) != (1,)",
    ),
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
    "infinite reward": (
        [hello(), step(GOOD_OBS, reward=np.array([np.inf]))],
        INVALID,
        "reward: value inf at index (0,) is not finite",
    ),
    "reward too large for float32": (
        [hello(), step(GOOD_OBS, reward=np.array([1e300]))],
        INVALID,
        "reward: value inf at index (0,) is not finite",
    ),
    "missing reward after the first step": (
        [hello(), step(GOOD_OBS), pb.ClientMessage(step=pb.Step(obs=codec.to_value(GOOD_OBS)))],
        INVALID,
        "reward: missing",
    ),
    "reward of no dtype": (
        [hello(), step(GOOD_OBS), step(GOOD_OBS, reward=tensor_pb2.Tensor(shape=[1]))],
        INVALID,
        "reward: dtype unset (DTYPE_UNSPECIFIED) does not fit Box of float32 (send a float)",
    ),
    "terminated byte neither 0 nor 1": (
        [
            hello(),
            step(GOOD_OBS),
            step(GOOD_OBS, terminated=tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_BOOL, shape=[1], data=b"\x02")),
        ],
        INVALID,
        "terminated: bool byte 2 at byte 0: a bool is one byte, 0 or 1",
    ),
    "step before hello": ([step(GOOD_OBS)], PRECONDITION, "step before hello"),
    "close before hello": ([pb.ClientMessage(close=pb.Close())], PRECONDITION, "close before hello"),
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
    "Discrete whose last value is past int64": (
        [
            pb.ClientMessage(
                hello=pb.Hello(
                    num_envs=1,
                    observation_space=tensor_pb2.Space(discrete=tensor_pb2.DiscreteSpace(n=3, start=2**63 - 2)),
                    action_space=codec.space_to_proto(DISCRETE2),
                )
            )
        ],
        INVALID,
        "hello.observation_space: Discrete needs start + n - 1 in int64",
    ),
    "client id too long": (
        [hello_message(BOX4, DISCRETE2, 1, True, "x" * (MAX_CLIENT_ID + 1))],
        INVALID,
        f"hello.client_id: {MAX_CLIENT_ID + 1} characters > {MAX_CLIENT_ID}",
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
    # Each space costs gymnasium microseconds to build: a 16 MiB hello of a million of them held every client for 11 s.
    "more spaces than a message may hold": (
        [hello(gym.spaces.Tuple([gym.spaces.Discrete(2)] * 20_000))],
        INVALID,
        "hello.observation_space[16383]: the message holds more than 16384 spaces",
    ),
    # Infos are converted, stored and shipped value by value on the event loop: 6 MB of them held others for 2.4 s.
    "infos of more than 256 KiB": (
        [hello(), step(GOOD_OBS, infos=[{"values": list(range(40_000))}])],
        INVALID,
        "infos: 440020 bytes in one step > 262144: infos are stored with every step",
    ),
    # Quoted whole, its status message (a trailer) was too large for gRPC: the client got RESOURCE_EXHAUSTED instead.
    "module id of 100,000 characters": (
        [pb.ClientMessage(hello=pb.Hello(num_envs=1, module_id="é" * 100_000))],
        grpc.StatusCode.NOT_FOUND,
        "unknown module_id 'éé",
    ),
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
        assert len(details.encode()) <= 1100  # what the client sent is quoted in part
        before = good.stats.env_steps
        await wait_for_steps(good, before + 20)  # the good client never noticed
    if case != "oversized message":  # gRPC itself refuses those, before any handler of ours runs
        assert server.metrics.registry.get_sample_value("rlgate_rejected_total", {"code": code.name}) >= 1


async def test_client_ids_are_logged_escaped_so_they_cannot_forge_log_lines(server, caplog):
    caplog.set_level(logging.INFO, logger="rlgate.server.policy_service")
    forged = "x\n2026-01-01 00:00:00,000 ERROR rlgate.server.policy_service FORGED"
    forged += "." * (MAX_CLIENT_ID - len(forged))  # the longest id accepted
    raw = RawStream(server)
    try:
        await raw.send(hello_message(BOX4, DISCRETE2, 1, True, forged))
        assert (await raw.recv()).HasField("welcome")
        await raw.send(pb.ClientMessage(close=pb.Close()))
        assert (await raw.status())[0] == grpc.StatusCode.OK
    finally:
        await raw.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "rlgate.server.policy_service"]
    assert sum(repr(forged) in line for line in lines) == 2  # the session's open and close
    assert not any("\n" in line for line in lines)


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
    assert status == INVALID and details == "obs: value 7 at index (0,) outside the Discrete bounds [0, 2]"


async def test_a_dict_observation_with_a_thousand_keys_too_many_is_told_in_a_line(server_factory):
    server = await server_factory()
    raw = RawStream(server)
    try:
        await raw.send(hello(gym.spaces.Dict({"a": BOX4})))
        assert (await raw.recv()).WhichOneof("kind") == "welcome"
        obs = {f"key_{i:04}": np.zeros((1, 4), np.float32) for i in range(1000)}
        await raw.send(step(obs))
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == INVALID
    assert re.fullmatch(r"obs: keys \['key_\d{4}'(, 'key_\d{4}'){9}\] and 990 more != \['a'\]", details), details


async def test_a_client_with_other_spaces_is_told_only_what_differs(server):
    good = EnvClient(SpaceEnv(BOX4, DISCRETE2), target(server), seed=0)
    await good.run(max_steps=3)
    low, high = np.array([-1, -1, -np.inf, -1], np.float32), np.array([1, 1, np.inf, 1], np.float32)
    other_obs = gym.spaces.Box(low, high, dtype=np.float32)
    raw = RawStream(server)
    try:
        await raw.send(hello(observation_space=other_obs, action_space=gym.spaces.Discrete(3)))
        status, details = await raw.status()
    finally:
        await raw.close()
    assert status == PRECONDITION
    assert details == (
        "the hello's spaces must equal the served model's; they differ in (server != client): "
        "observation_space.low[2]: -1.0 != -inf; observation_space.high[2]: 1.0 != inf; action_space.n: 2 != 3"
    )


async def exchange(server, *messages: pb.ClientMessage) -> tuple[list[pb.ServerMessage], grpc.StatusCode, str]:
    """Send the messages on one stream (each answered before the next), close it; the answers and the status."""
    raw = RawStream(server)
    answers = []
    try:
        for message in messages:
            await raw.send(message)
            try:
                answers.append(await raw.recv())
            except grpc.aio.AioRpcError:
                break
        else:
            await raw.send(pb.ClientMessage(close=pb.Close()))
            await raw.call.done_writing()
        status, details = await raw.status()
    finally:
        await raw.close()
    return answers, status, details


async def test_float64_observations_for_a_float32_box_are_converted(server_factory, tmp_path):
    server = await server_factory()
    obs = np.array([[0.1, -0.2, 0.3, 1.0]])  # float64, as numpy makes them
    answers, status, _ = await exchange(server, hello(), step(obs), step(obs, terminated=np.array([True])))
    assert status == grpc.StatusCode.OK and [a.WhichOneof("kind") for a in answers] == ["welcome", "actions", "actions"]
    await server.stop()
    (episode,) = shipped(tmp_path / "episodes")
    observations = codec.from_value(episode.observations)
    assert observations.dtype == np.float32
    np.testing.assert_array_equal(observations, obs.astype(np.float32).repeat(2, axis=0))


async def test_the_first_step_may_leave_out_rewards_and_flags(server):
    bare = pb.ClientMessage(step=pb.Step(obs=codec.to_value(GOOD_OBS)))
    answers, status, details = await exchange(server, hello(), bare, step(GOOD_OBS))
    assert status == grpc.StatusCode.OK, details
    assert [a.WhichOneof("kind") for a in answers] == ["welcome", "actions", "actions"]


UNBOUNDED = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


@pytest.mark.parametrize("allow", [False, True])
async def test_infinite_observations_need_the_setting_and_nan_never_passes(server_factory, allow):
    server = await server_factory(allow_non_finite_obs=allow)
    inf_obs = np.array([[0.0, np.inf, -np.inf, 0.0]], np.float32)
    answers, status, details = await exchange(server, hello(UNBOUNDED), step(inf_obs))
    if allow:
        assert status == grpc.StatusCode.OK and len(answers) == 2, details
    else:
        assert status == INVALID
        assert details.startswith("obs: value inf at index (0, 1) is not finite (+-inf passes only where")
    nan_obs = np.array([[0.0, np.nan, 0.0, 0.0]], np.float32)
    _, status, details = await exchange(server, hello(UNBOUNDED), step(nan_obs))
    assert status == INVALID and details == "obs: NaN at index (0, 1)"
    _, status, details = await exchange(server, hello(UNBOUNDED), step(GOOD_OBS), step(GOOD_OBS, reward=[-np.inf]))
    assert status == INVALID and details == "reward: value -inf at index (0,) is not finite"
    expected = {"obs": 2 - allow, "reward": 1}
    assert server.status.status()["non_finite_rejected"] == expected
    for field, count in expected.items():
        assert server.metrics.non_finite_rejected.labels(field)._value.get() == count


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", "secret"),)])
async def test_missing_or_wrong_token_is_unauthenticated(server_factory, metadata):
    server = await server_factory(token="secret")
    raw = RawStream(server, metadata=metadata)
    try:
        # Refused on its metadata alone, before any message: a hello written after the refusal could turn the
        # status grpcio reports into INTERNAL (grpc/grpc#36066; seen once in a full run).
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


async def test_a_server_still_waiting_for_its_learners_weights_is_unavailable(server_factory):
    server = await server_factory(learner="127.0.0.1:1")  # nothing listens there: no weights come
    _, status, details = await exchange(server, hello())
    assert status == grpc.StatusCode.UNAVAILABLE
    assert details == "no model yet: waiting for the learner's first weights"


async def test_data_that_breaks_a_users_piece_fails_its_stream_alone_with_the_error_named(server_factory):
    """In-bounds data that a spec's own piece raises on is the server's fault (INTERNAL, naming the error), and
    ends only that stream: a batch it shared runs again request by request (tests/server/test_batcher.py)."""
    spec = RunSpec.parse({"connectors": {"env_to_module": [{"type": "support.pieces:FailOnValue", "value": 0.5}]}}, "t")
    server = await server_factory(spec=spec, allow_import=["support"])
    good = EnvClient(SpaceEnv(BOX4, DISCRETE2, length=10**6), target(server), seed=0)
    async with running_client(good):
        await wait_for_steps(good, 5)
        raw = RawStream(server)
        try:
            await raw.send(hello())
            await raw.recv()
            await raw.send(step(np.full((1, 4), 0.5, np.float32)))
            status, details = await raw.status()
        finally:
            await raw.close()
        assert status == grpc.StatusCode.INTERNAL
        assert details == "server error: ValueError: observation value 0.5 is not for me"
        before = good.stats.env_steps
        await wait_for_steps(good, before + 20)
