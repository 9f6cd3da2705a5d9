"""Bytes that are no message of the proto, on each LearnerService RPC: INVALID_ARGUMENT naming the message type
(what a client written from the proto alone, in any language, can act on), and the learner serves on."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.batches import episode_batch

from rlgate.learner.servers import MAX_SERVER_ID
from rlgate.v1 import learner_pb2, learner_pb2_grpc

SERVICE = "/rlgate.v1.LearnerService/"
NOT_A_MESSAGE = b"\xff\xff\xff\xff"  # a field tag whose varint never ends


@pytest.mark.parametrize(
    ("method", "request_type", "kind"),
    [
        ("SubmitEpisodes", "EpisodeBatch", "stream_stream"),
        ("WatchWeights", "WatchWeightsRequest", "unary_stream"),
        ("GetStatus", "GetStatusRequest", "unary_unary"),
        ("ReportServer", "ServerReport", "unary_unary"),
    ],
)
async def test_undecodable_request_is_invalid_argument_naming_its_type(learner_server, method, request_type, kind):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
        rpc = getattr(channel, kind)(SERVICE + method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async with asyncio.timeout(30):
                if kind == "stream_stream":
                    call = rpc()
                    await call.write(NOT_A_MESSAGE)
                    await call.read()
                elif kind == "unary_stream":
                    await rpc(NOT_A_MESSAGE).read()
                else:
                    await rpc(NOT_A_MESSAGE)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"not a valid rlgate.v1.{request_type}" in caught.value.details()
        # The learner serves on: a well-formed call on the same channel is answered.
        status = await learner_pb2_grpc.LearnerServiceStub(channel).GetStatus(learner_pb2.GetStatusRequest())
        assert status.model_version == learner_server.learner.trainer.version


async def test_batches_before_undecodable_bytes_are_acknowledged(learner_server, cartpole_chunks):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
        call = channel.stream_stream(
            SERVICE + "SubmitEpisodes", request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
        )()
        batch = episode_batch(cartpole_chunks(20)[:2], seq=7)
        await call.write(batch.SerializeToString())
        ack = await asyncio.wait_for(call.read(), 30)
        assert (ack.seq, ack.accepted) == (7, 2)
        await call.write(NOT_A_MESSAGE)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call.read(), 30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_and_reflection_serve_the_learner_service(learner_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
        check = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlgate.v1.LearnerService")
        )
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo
        stream = reflect(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        services = [s.name async for r in stream for s in r.list_services_response.service]
        assert "rlgate.v1.LearnerService" in services
        symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol="rlgate.v1.LearnerService")
        stream = reflect(iter([symbol]))
        files = [f async for r in stream for f in r.file_descriptor_response.file_descriptor_proto]
        assert files  # a client can build the service's stubs from what reflection gives


async def test_a_server_id_too_long_to_keep_is_invalid_argument(learner_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ReportServer(learner_pb2.ServerReport(server_id="s" * (MAX_SERVER_ID + 1)), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"server_id: {MAX_SERVER_ID + 1} characters > {MAX_SERVER_ID}" in caught.value.details()
        await stub.ReportServer(learner_pb2.ServerReport(server_id="s" * MAX_SERVER_ID), timeout=30)
        assert [s["id"] for s in learner_server.learner.servers.connected()] == ["s" * MAX_SERVER_ID]
