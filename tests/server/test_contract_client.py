"""A client written from proto/README.md and the generated stubs alone, as a Node.js, Go or Rust author would.

It uses no rlgate code but the stubs of proto/: it builds tensors by hand (dtype enum, shape, little-endian
bytes), declares CartPole's spaces with their +-inf bounds, sends float64 observations, follows the autoreset
convention, keeps two steps in flight, ends streams with Close, and reads errors from the final status. Each
assertion is a sentence of the document; when one fails, the document or the server is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import gymnasium as gym
import numpy as np
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.hand_made import AUTH, CARTPOLE_ACTIONS, CARTPOLE_OBS, HIGH, TOKEN, array, box, tensor

from rlgate.v1 import episode_pb2, policy_pb2_grpc, tensor_pb2
from rlgate.v1 import policy_pb2 as pb


def hello(num_envs: int, observation_space: tensor_pb2.Space = CARTPOLE_OBS) -> pb.ClientMessage:
    return pb.ClientMessage(
        hello=pb.Hello(
            client_id="from-the-proto",
            observation_space=observation_space,
            action_space=CARTPOLE_ACTIONS,
            num_envs=num_envs,
            explore=True,
        )
    )


def step(obs: np.ndarray, reward=None, terminated=None, truncated=None, infos=()) -> pb.ClientMessage:
    """Observations in float64, as a JavaScript client has them; reward and flags left out when None."""
    message = pb.Step(obs=tensor_pb2.Value(tensor=tensor(np.asarray(obs, "<f8"))), infos=infos)
    if reward is not None:
        message.reward.CopyFrom(tensor(np.asarray(reward, "<f8")))
        message.terminated.CopyFrom(tensor(np.asarray(terminated, bool)))
        message.truncated.CopyFrom(tensor(np.asarray(truncated, bool)))
    return pb.ClientMessage(step=message)


def info(**numbers: float) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(numbers)
    return struct


async def final_status(call: grpc.aio.StreamStreamCall) -> tuple[grpc.StatusCode, str]:
    return await asyncio.wait_for(call.code(), 10), await call.details()


async def test_a_client_written_from_the_proto_alone(server_factory, tmp_path):
    server = await server_factory(env="CartPole-v1", token=TOKEN)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        # Health checks need no token; every other call does.
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rlgate.v1.PolicyService"):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        call = stub.Connect()
        with contextlib.suppress(grpc.aio.AioRpcError):  # the server may refuse the call before the hello is written
            await call.write(hello(1))
        assert (await final_status(call))[0] == grpc.StatusCode.UNAUTHENTICATED

        # The hello's spaces must equal the model's: a float64 Box is told exactly which field differs.
        call = stub.Connect(metadata=AUTH)
        await call.write(hello(1, box(-HIGH.astype("<f8"), HIGH.astype("<f8"))))
        code, details = await final_status(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert details.endswith("differ in (server != client): observation_space.dtype: float32 != float64")

        # A session of two CartPoles, run until both have ended an episode; float64 observations are converted.
        envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")  # autoreset NEXT_STEP
        call = stub.Connect(metadata=AUTH)
        await call.write(hello(2))
        welcome = (await call.read()).welcome
        obs, _ = envs.reset(seed=0)
        await call.write(step(obs))  # the first step: reset observations, reward and flags may be left out
        ended = np.zeros(2, int)
        for _ in range(1000):
            actions = (await call.read()).actions.actions.tensor
            assert actions.dtype == tensor_pb2.DTYPE_INT32 and list(actions.shape) == [2]  # Discrete: int32 [N]
            obs, rewards, terminated, truncated, _ = envs.step(array(actions))
            ended += terminated | truncated
            await call.write(step(obs, rewards, terminated, truncated))
            if ended.min() >= 1:
                break
        assert ended.min() >= 1, "CartPole episodes end within 1000 steps"
        await call.read()  # the last step's answer
        await call.write(pb.ClientMessage(close=pb.Close()))  # ends the stream: no half-close needed
        assert await final_status(call) == (grpc.StatusCode.OK, "")
        envs.close()

        # Autoreset by hand with both flags set, and two steps in flight: the terminal observation and, without
        # waiting for its (discarded) answer, the reset observation; one answer each, in order. Infos' numbers
        # may be NaN or +-inf (doubles; JSON has no spelling for them) and are kept.
        call = stub.Connect(metadata=AUTH)
        await call.write(hello(1))
        hand = (await call.read()).welcome
        first, terminal, reset = np.zeros((1, 4)), np.full((1, 4), 0.01), np.full((1, 4), -0.01)
        await call.write(step(first, infos=[info(nan=float("nan"))]))
        assert (await call.read()).WhichOneof("kind") == "actions"
        await call.write(step(terminal, [1.0], [True], [True], [info(inf=float("-inf"))]))
        await call.write(step(reset, [0.0], [False], [False]))
        answers = [await asyncio.wait_for(call.read(), 10) for _ in range(2)]
        assert [a.WhichOneof("kind") for a in answers] == ["actions", "actions"]
        await call.write(pb.ClientMessage(close=pb.Close()))
        assert await final_status(call) == (grpc.StatusCode.OK, "")

        # Bad input ends the stream; the error is its final status, the message names the field.
        call = stub.Connect(metadata=AUTH)
        await call.write(hello(1))
        await call.read()
        await call.write(step(np.zeros((1, 4))))
        await call.read()
        await call.write(step(np.zeros((1, 4)), [np.inf], [False], [False]))
        assert await final_status(call) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "reward: value inf at index (0,) is not finite",
        )

    await server.stop()
    chunks = [episode_pb2.Episode.FromString(p.read_bytes()) for p in (tmp_path / "episodes").glob("*.pb")]
    session = [c for c in chunks if c.id.startswith(welcome.session_id)]
    assert sum(c.terminated or c.truncated for c in session) >= 3  # >= 1 ended per sub-env, + those Close cut
    assert sum(c.terminated for c in session) >= 2
    (by_hand,) = [c for c in chunks if c.id.startswith(hand.session_id)]  # the reset one has no step yet
    assert by_hand.terminated and by_hand.truncated
    assert array(by_hand.rewards).tolist() == [1.0]
    observations = array(by_hand.observations.tensor)
    assert observations.dtype == np.float32 and np.allclose(observations, np.concatenate([first, terminal]))
    first_info, terminal_info = by_hand.infos
    assert np.isnan(first_info.fields["nan"].number_value) and terminal_info.fields["inf"].number_value == -np.inf
