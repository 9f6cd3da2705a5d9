"""WatchWeights refuses an after_version no learner publishes (INVALID_ARGUMENT): the learner would skip its own
version past it, beyond int64 for 2**63 - 1, and then neither answer GetStatus nor train. Versions stay below
2**62, as learner.proto says."""

from __future__ import annotations

import grpc
import pytest
from support.learners import weights_after

from rlgate.learner.main import LearnerServer
from rlgate.v1 import learner_pb2, learner_pb2_grpc


async def model_version(server: LearnerServer) -> int:
    """The version GetStatus reports."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        status = await learner_pb2_grpc.LearnerServiceStub(channel).GetStatus(
            learner_pb2.GetStatusRequest(), timeout=10
        )
    return status.model_version


@pytest.mark.parametrize("after_version", [2**63 - 1, 2**62, -2])
async def test_a_version_no_learner_publishes_is_refused_and_training_goes_on(
    learner_server, train_updates, after_version
):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await weights_after(learner_server, after_version)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"after_version {after_version} is out of range" in refused.value.details()
    assert await model_version(learner_server) == 0
    await train_updates(learner_server, 1)
    assert await model_version(learner_server) == 1
    assert (await weights_after(learner_server, 0)).version == 1  # published to the servers as before


async def test_a_server_holding_the_highest_version_allowed_gets_the_next_one(learner_server):
    """A server with a version this learner never published (one from before a restart) is still skipped past."""
    assert (await weights_after(learner_server, 2**62 - 1)).version == 2**62
    assert await model_version(learner_server) == 2**62
