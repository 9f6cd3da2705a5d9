"""What `Policy` and `MultiAgentPolicy` share: loading (from a checkpoint directory, or from what a running learner
publishes now) and the built pipelines and module they act with.

Each says, in `from_parts`, how it is made from a run spec, the env's spaces and the weights (one set, or one
per module in a multi-agent run).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import grpc
import gymnasium as gym

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core import codec
from rlgate.policy.acting import ActingCore
from rlgate.policy.published import connector_state, spec_of
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from rlgate.v1 import learner_pb2, learner_pb2_grpc


class TrainedPolicy:
    """`load`, `from_checkpoint` and `from_learner` for a policy class with a `from_parts` constructor; it acts
    through its `core` (the ActingCore a server acts with), whose statistics stay as trained."""

    core: ActingCore

    def _act_with(self, core: ActingCore) -> None:
        """Act with `core`, its connector statistics (MeanStdFilter's) as trained: acting does not move them."""
        core.freeze_statistics()
        self.core = core
        self._lookback = max(core.spec.sampling.episode_lookback_horizon, 1)

    @property
    def spec(self) -> RunSpec:
        """The run spec the policy was trained with."""
        return self.core.spec

    @property
    def version(self) -> int:
        """The model version acting."""
        return self.core.version

    @property
    def module(self) -> Any:
        """The RLModule (a MultiRLModule in a multi-agent run)."""
        return self.core.module

    @property
    def env_to_module(self) -> ConnectorPipelineV2:
        return self.core.env_to_module

    @property
    def module_to_env(self) -> ConnectorPipelineV2:
        return self.core.module_to_env

    @classmethod
    def from_parts(
        cls,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        weights: bytes | dict[str, bytes],
        **kwargs: Any,
    ) -> Self:
        """The policy for a run spec, the env's spaces and its weights (a dict by module id: multi-agent);
        `kwargs`: connector_state, version, imports, device, seed."""
        raise NotImplementedError

    @classmethod
    def load(
        cls, path: str | Path, *, allow_import: Iterable[str] = (), device: str = "cpu", seed: int | None = None
    ) -> Self:
        """The policy in a checkpoint directory (or the newest in a folder of them). Code its run spec names
        (connector pieces, a model class) is imported only from the modules in `allow_import`."""
        return cls.from_checkpoint(checkpoint.load(Path(path)), allow_import=allow_import, device=device, seed=seed)

    @classmethod
    def from_checkpoint(
        cls,
        found: checkpoint.Checkpoint,
        *,
        allow_import: Iterable[str] = (),
        device: str = "cpu",
        seed: int | None = None,
    ) -> Self:
        """The policy of a loaded checkpoint (see `load`)."""
        with found.loading_weights():
            return cls.from_parts(
                found.spec,
                found.observation_space,
                found.action_space,
                found.module_weights if found.module_weights is not None else found.weights,
                connector_state=found.connector_state,
                version=found.version,
                imports=ImportPolicy(allow_import),
                device=device,
                seed=seed,
            )

    @classmethod
    def from_learner(
        cls,
        target: str,
        *,
        allow_import: Iterable[str] = (),
        token: str | None = None,
        tls_ca: bytes | None = None,
        timeout_s: float = 30.0,
        device: str = "cpu",
        seed: int | None = None,
    ) -> Self:
        """The policy a running learner (`host:port`) publishes now, as its servers get it (WatchWeights).
        Raises ConnectionError when the learner cannot be reached within `timeout_s`."""
        weights = published_weights(target, token=token, tls_ca=tls_ca, timeout_s=timeout_s)
        return cls.from_parts(
            spec_of(weights, f"the run spec of learner {target}"),
            codec.space_from_proto(weights.observation_space),
            codec.space_from_proto(weights.action_space),
            dict(weights.module_weights) if weights.module_weights else weights.safetensors,
            connector_state=connector_state(weights) or {},
            version=weights.version,
            imports=ImportPolicy(allow_import),
            device=device,
            seed=seed,
        )


def published_weights(target: str, *, token: str | None, tls_ca: bytes | None, timeout_s: float) -> learner_pb2.Weights:
    """What a running learner (`host:port`) publishes now (its first WatchWeights message). Raises
    ConnectionError when the learner cannot be reached within `timeout_s`."""
    options = [("grpc.max_receive_message_length", 256 << 20)]
    if tls_ca is not None:
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(tls_ca), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    request = learner_pb2.WatchWeightsRequest(server_id=f"policy-{uuid.uuid4().hex[:8]}", after_version=-1)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with channel:
        call = learner_pb2_grpc.LearnerServiceStub(channel).WatchWeights(
            request, metadata=metadata, timeout=timeout_s, wait_for_ready=True
        )
        try:
            weights = next(call, None)
        except grpc.RpcError as exc:
            raise ConnectionError(f"learner {target}: {exc.code().name}: {exc.details()}") from None
        finally:
            call.cancel()
    if weights is None:  # not rlgate's learner, or one stopping: WatchWeights ended without a message
        raise ConnectionError(f"learner {target}: WatchWeights ended without weights")
    return weights
