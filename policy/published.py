"""A learner's `Weights` message as an ActingCore takes it, and an ActingCore's own policy as such a message.

A learner publishes every version as one `rlgate.v1.Weights` (run spec, env spaces, safetensors, connector state,
pacing); its servers build or swap their acting core from it, and relay it to their local-inference clients, which
do the same. A server that serves a policy of its own (a checkpoint, a fresh model) hands its clients that policy
in the same message (`weights_message`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from rlgate.core import codec
from rlgate.models import weights_to_bytes
from rlgate.policy.acting import ActingCore
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2

# The versions a WatchWeights request may name stay below this: far below int64's limit (the wire's), so neither
# the version a learner skips to, one past a server's, nor the updates after it can pass that.
MAX_VERSION = 2**62


def spec_of(weights: learner_pb2.Weights, source: str) -> RunSpec:
    """The run spec a Weights message carries; SpecError (naming `source`) when it is none."""
    return RunSpec.from_json(weights.spec_json, source)


def core_from_weights(weights: learner_pb2.Weights, spec: RunSpec, imports: ImportPolicy, **build: Any) -> ActingCore:
    """The acting core of `spec` (the message's own, parsed) at the message's version; `build`: ActingCore.build's
    keyword arguments (device, seed, stage_seconds). SpecError for code `imports` does not allow."""
    return ActingCore.build(
        spec,
        codec.space_from_proto(weights.observation_space),
        codec.space_from_proto(weights.action_space),
        imports,
        connector_state=connector_state(weights),
        version=weights.version,
        **module_weights(weights, spec),
        **build,
    )


def swap_weights(core: ActingCore, weights: learner_pb2.Weights) -> Future | None:
    """Act with a newer version's weights and connector state (between two batches; an older one is ignored); see
    ActingCore.set_weights for the future an onnxruntime core returns."""
    return core.set_weights(
        weights.version, connector_state=connector_state(weights), **module_weights(weights, core.spec)
    )


def acts_only_newest(spec: RunSpec) -> bool:
    """Whether sampling and training take turns (on-policy without `overlap_sampling`): every step after a new
    version came must be that version's, so acting waits the few milliseconds an onnxruntime core takes to rebind
    (elsewhere the old version acts meanwhile)."""
    return not getattr(spec.algorithm, "overlap_sampling", True)


def module_weights(weights: learner_pb2.Weights, spec: RunSpec) -> dict[str, Any]:
    """A Weights message's weights, as the acting core of `spec` takes them (per module when multi-agent)."""
    if spec.multi_agent:
        return {"weights": dict(weights.module_weights), "module_versions": dict(weights.module_versions)}
    return {"weights": weights.safetensors}


def connector_state(weights: learner_pb2.Weights) -> dict[str, Any] | None:
    """The merged connector state (MeanStdFilter's statistics) a Weights message carries, if any."""
    return codec.from_value(weights.connector_state, "connector_state") if weights.HasField("connector_state") else None


def weights_message(core: ActingCore, max_unacked_steps: int = 0) -> learner_pb2.Weights:
    """`core`'s policy as a learner would publish it: its spec, env spaces, weights, connector state and version
    (call it between batches)."""
    if core.multi_agent:
        per_module: dict[str, Any] = {
            "module_weights": {m: weights_to_bytes(module) for m, module in core.module.items()},
            "module_versions": core.module_versions,
        }
    else:
        per_module = {"safetensors": weights_to_bytes(core.module)}
    # Statistics as one global state (the delta folded in, none left): a client counts only what it sees itself.
    pipeline = core.env_to_module
    state = pipeline.get_state()
    state = pipeline.merge_states([state]) if state else state
    return learner_pb2.Weights(
        version=core.version,
        **per_module,
        observation_space=codec.space_to_proto(core.observation_space),
        action_space=codec.space_to_proto(core.action_space),
        spec_json=core.spec.to_json(),
        max_unacked_steps=max_unacked_steps,
        connector_state=codec.to_value(state) if state else None,
    )
