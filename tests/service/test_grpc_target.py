"""`--learner` targets: the forms gRPC dials pass as they are; anything else is refused at start."""

from __future__ import annotations

import pytest

from rlgate.service.settings import grpc_target


@pytest.mark.parametrize(
    "target", ["127.0.0.1:50052", "learner:50052", "my-learner.example.com:1", "[::1]:50052", "dns:///learner:50052"]
)
def test_dialable_targets_pass(target: str) -> None:
    assert grpc_target(target) == target


@pytest.mark.parametrize("target", ["not a host", "learner", "learner:0", "learner:65536", ":50052", "dns:///a b:1"])
def test_malformed_targets_are_refused(target: str) -> None:
    with pytest.raises(ValueError, match="not a gRPC target"):
        grpc_target(target)
