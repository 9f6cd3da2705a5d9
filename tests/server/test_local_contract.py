"""PolicyService's local-inference calls (WatchWeights, SubmitEpisodes) from the proto alone, as a client in another
language would make them: weights relayed as the learner's messages, a batch of hand-made chunks acknowledged once the
server holds it, and every kind of bad input ending the call with the status and message proto/README.md names."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
from support.hand_made import AUTH, CARTPOLE_ACTIONS, CARTPOLE_OBS, TOKEN, array, tensor

from rlgate.v1 import episode_pb2, learner_pb2, policy_pb2_grpc, tensor_pb2
from rlgate.v1 import policy_pb2 as pb

SUBMIT = "/rlgate.v1.PolicyService/SubmitEpisodes"


def chunk_table(episode_id: str, steps: int, version: int = 0, module_id: str = "") -> episode_pb2.EpisodeChunks:
    """One CartPole chunk of `steps` steps that terminated, as a table: its columns as hand-made tensors."""
    return episode_pb2.EpisodeChunks(
        module_id=module_id,
        ids=[episode_id],
        chunk_indices=[0],
        len_lookback_buffers=[0],
        steps=[steps],
        terminated=[True],
        truncated=[False],
        t_started=[0],
        observations=tensor_pb2.Value(tensor=tensor(np.full((steps + 1, 4), 0.01, "<f4"))),
        actions=tensor_pb2.Value(tensor=tensor(np.zeros(steps, "<i8"))),
        rewards=tensor(np.ones(steps, "<f4")),
        extra_model_outputs={"action_logp": tensor_pb2.Value(tensor=tensor(np.full(steps, -0.69, "<f4")))},
        model_versions=tensor(np.full(steps, version, "<i8")),
    )


def batch(seq: int, *tables: episode_pb2.EpisodeChunks, observation_space=CARTPOLE_OBS) -> pb.EpisodeSubmission:
    return pb.EpisodeSubmission(
        batch=learner_pb2.EpisodeBatch(seq=seq, chunks=tables, observation_space=observation_space)
    )


def hello(spec_json: str, num_envs: int = 1) -> pb.EpisodeSubmission:
    return pb.EpisodeSubmission(
        hello=pb.SubmitHello(client_id="from-the-proto", spec_json=spec_json, num_envs=num_envs)
    )


async def refused(channel: grpc.aio.Channel, *messages: pb.EpisodeSubmission | bytes) -> tuple[grpc.StatusCode, str]:
    """Send these messages on one SubmitEpisodes stream; the status it ends with (reading any acks meanwhile)."""
    call = channel.stream_stream(
        SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
    )(metadata=AUTH)
    try:
        for message in messages:
            await call.write(message if isinstance(message, bytes) else message.SerializeToString())
        await call.done_writing()
        async for _ in call:
            pass
    except grpc.aio.AioRpcError:  # the status it ended with: read below
        pass
    return await asyncio.wait_for(call.code(), 10), await call.details()


async def test_a_local_client_from_the_proto_alone(server_factory, tmp_path):
    server = await server_factory(env="CartPole-v1", token=TOKEN)  # its own fresh model, episode files, no learner
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)

        # The weights to act with: the run spec, the env's spaces, safetensors; a server without a learner sends its
        # own policy's once, with no window of unacknowledged steps (no limit).
        call = stub.WatchWeights(
            learner_pb2.WatchWeightsRequest(server_id="from-the-proto", after_version=-1), metadata=AUTH
        )
        weights = await asyncio.wait_for(call.read(), 10)
        call.cancel()
        assert weights.version == 0 and weights.max_unacked_steps == 0
        assert weights.observation_space == CARTPOLE_OBS and weights.action_space == CARTPOLE_ACTIONS
        assert json.loads(weights.spec_json)["env"]["id"] == "CartPole-v1" and weights.safetensors
        assert weights.connector_state == tensor_pb2.Value()  # the default pipeline keeps no statistics

        # Episodes: a hello naming that run spec, then batches, each acknowledged by seq once the server holds it.
        call = channel.stream_stream(
            SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
        )(metadata=AUTH)
        await call.write(hello(weights.spec_json).SerializeToString())
        # The server's (empty) initial metadata says the hello is accepted, before any batch or ack.
        assert await asyncio.wait_for(call.initial_metadata(), 10) is not None and not call.done()
        await call.write(batch(7, chunk_table("proto-a", 3), chunk_table("proto-b", 2)).SerializeToString())
        ack = await asyncio.wait_for(call.read(), 10)
        assert (ack.seq, ack.accepted, ack.duplicates, ack.rejected) == (7, 2, 0, 0)
        assert not ack.HasField("room")  # no learner: no room to report
        assert server.status.status()["local_clients"]["clients"][0]["env_steps"] == 5
        await call.done_writing()
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.OK

        # Bad input: each ends the call with its status, the message says what to fix.
        spec = weights.spec_json
        other = json.dumps({**json.loads(spec), "algorithm": {**json.loads(spec)["algorithm"], "lr": 0.5}})
        cases = [
            ((b"\xff\xff",), grpc.StatusCode.INVALID_ARGUMENT, "not a valid rlgate.v1.EpisodeSubmission"),
            ((pb.EpisodeSubmission(),), grpc.StatusCode.INVALID_ARGUMENT, "empty message: set hello or batch"),
            ((batch(1, chunk_table("x", 1)),), grpc.StatusCode.FAILED_PRECONDITION, "batch before hello"),
            ((hello("{"),), grpc.StatusCode.INVALID_ARGUMENT, "hello.spec_json: not JSON"),
            ((hello(other),), grpc.StatusCode.FAILED_PRECONDITION, "not the run spec this server serves"),
            ((hello(spec, num_envs=0),), grpc.StatusCode.INVALID_ARGUMENT, "hello.num_envs must be at least 1"),
            ((hello(spec), hello(spec)), grpc.StatusCode.FAILED_PRECONDITION, "hello sent twice"),
            ((hello(spec), batch(1)), grpc.StatusCode.INVALID_ARGUMENT, "a batch holds at least one table"),
            (
                (hello(spec), batch(1, chunk_table("x", 1), observation_space=CARTPOLE_ACTIONS)),
                grpc.StatusCode.FAILED_PRECONDITION,
                "batch.observation_space Discrete(2) is none the served run's",
            ),
            (
                (hello(spec), batch(1, chunk_table("x", 1, module_id="blue"))),
                grpc.StatusCode.FAILED_PRECONDITION,
                "batch.chunks[0].module_id 'blue': the served run has no such module",
            ),
        ]
        for messages, code, message in cases:
            status, details = await refused(channel, *messages)
            assert status == code and message in details, (messages, status, details)

        for after_version in (-2, 2**62):
            call = stub.WatchWeights(learner_pb2.WatchWeightsRequest(after_version=after_version), metadata=AUTH)
            with_status = await asyncio.wait_for(call.code(), 10), await call.details()
            assert with_status == (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"after_version {after_version} is out of range: -1 (none yet) or a version below 2**62",
            )
        call = stub.WatchWeights(learner_pb2.WatchWeightsRequest(after_version=-1))  # no token
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.UNAUTHENTICATED

    await server.stop()
    # The acknowledged chunks are in the server's episode files, as its sessions' are.
    files = {
        path.stem: episode_pb2.Episode.FromString(path.read_bytes()) for path in (tmp_path / "episodes").glob("*.pb")
    }
    assert set(files) == {"proto-a-0", "proto-b-0"}
    assert array(files["proto-a-0"].rewards).tolist() == [1.0, 1.0, 1.0] and files["proto-a-0"].terminated


async def test_a_server_that_keeps_no_episodes_refuses_them_and_one_without_a_model_yet_is_unavailable(server_factory):
    server = await server_factory(episode_dir=None)  # no learner, no episode files, no env: no model until a session
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = policy_pb2_grpc.PolicyServiceStub(channel).WatchWeights(
            learner_pb2.WatchWeightsRequest(after_version=-1)
        )
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.UNAVAILABLE
        assert "no model yet" in await call.details()
        call = channel.stream_stream(
            SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
        )()
        await call.write(hello("{}").SerializeToString())
        await call.done_writing()
        assert await asyncio.wait_for(call.code(), 10) == grpc.StatusCode.FAILED_PRECONDITION
        assert "this server keeps no episodes (no --learner, no --episode-dir)" in await call.details()
