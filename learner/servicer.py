"""`rlgate.v1.LearnerService` over gRPC: a thin layer that hands every call to the `Learner`.

Registered by `handler()`, which parses the requests (`service.requests`): bytes that are no message of the
proto are INVALID_ARGUMENT naming its type, for a client in any language.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from rlgate.learner.learner import Learner
from rlgate.service.requests import parsing_handler
from rlgate.v1 import learner_pb2, learner_pb2_grpc

SERVICE = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"]
SERVICE_NAME = SERVICE.full_name


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    """SubmitEpisodes (acked batches in), WatchWeights (every new version out), GetStatus, ReportServer.

    `http_port()`: the learner's HTTP port, which servers link their pages to.
    """

    def __init__(self, learner: Learner, http_port: Callable[[], int] = lambda: 0) -> None:
        self.learner = learner
        self._http_port = http_port

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method, its requests parsed here (not by gRPC's generated deserializers)."""
        return parsing_handler(SERVICE, self)

    async def SubmitEpisodes(
        self, request_iterator: AsyncIterator[learner_pb2.EpisodeBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[learner_pb2.EpisodeAck]:
        async for batch in request_iterator:
            yield await self.learner.accept(self.learner.decode(batch))

    async def WatchWeights(
        self, request: learner_pb2.WatchWeightsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[learner_pb2.Weights]:
        try:
            watch = self.learner.weights_after(request.after_version, request.server_id)
        except ValueError as exc:  # a version no learner publishes
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        async for weights in watch:
            yield weights

    async def GetStatus(
        self, request: learner_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.LearnerStatus:
        return self.learner.status_message()

    async def ReportServer(
        self, request: learner_pb2.ServerReport, context: grpc.aio.ServicerContext
    ) -> learner_pb2.ServerReportAck:
        try:
            self.learner.servers.report(request, context.peer())
        except ValueError as exc:  # an id too long to keep
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return learner_pb2.ServerReportAck(http_port=self._http_port())
