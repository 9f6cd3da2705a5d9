"""A learner's `Weights` message as an ONNX file: `rlgate export --explore`'s, for local-inference clients that act
with an ONNX runtime instead of torch (`clients/node`'s `--mode local`).

Such a client records the episodes it acts in and ships them as a server records a session (`PolicyService.
SubmitEpisodes`), but it runs none of the run's Python connector pieces. So the file is offered only for runs where
that records what a server would: single-agent, an env-to-module pipeline that leaves observations as the env returns
them (a piece that writes them back, MeanStdFilter, FlattenObservations, PrevActionsPrevRewards, would have the
learner train on observations the module never saw; frame stacking only builds the module's input and folds), and a
Discrete, MultiDiscrete or float Box action space (the file's `actions` are the env's: for a Box, unsquashed or
clipped, while the chunks hold the module's own, the file's `module_actions`). `NotExportable` says which rule a run
breaks.

The graph of a run spec and its env spaces is traced once, from a placeholder copy of its module (~0.3 s); each
version's file is that graph with the version's parameters rebound by name and the version in its contract: a few
milliseconds, as the server's ONNX Runtime backend rebinds its sessions.
"""

from __future__ import annotations

import importlib.metadata
import json
import threading

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime as ort

from rlgate.connectors.common.frame_stacking import FrameStacking
from rlgate.core import codec
from rlgate.episodes.multi_agent_episode import DEFAULT_MODULE_ID
from rlgate.export.checkpoint import policy_graph
from rlgate.export.contract import CONTRACT_KEY
from rlgate.export.onnx_file import parameters, placeholder, rebind, to_onnx
from rlgate.export.pieces import BATCHING, NotExportable
from rlgate.export.serving import reproduces
from rlgate.models import load_weights
from rlgate.spec.build import BuiltPolicy, build_policy
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2

PROVIDERS = ["CPUExecutionProvider"]
# Pieces that leave the episodes' observations as the env returned them.
_KEEPS_OBSERVATIONS = (*BATCHING, FrameStacking)


class OnnxWeights:
    """Each version's ONNX file, for one served run (its spec and env spaces): `file(weights)`, thread-safe."""

    def __init__(self, weights: learner_pb2.Weights, imports: ImportPolicy) -> None:
        """Traces the run's graph (call it off the event loop); NotExportable for a run a file cannot act in as a
        server would, SpecError for code `imports` does not allow."""
        self.spec_json = weights.spec_json
        spec = RunSpec.from_json(weights.spec_json, "the served run spec")
        if spec.multi_agent is not None:
            raise NotExportable("a multi-agent run: its clients act on the server (or with the Python client)")
        spaces = codec.space_from_proto(weights.observation_space), codec.space_from_proto(weights.action_space)
        if not _recordable(spaces[1]):
            raise NotExportable(
                f"the action space is {spaces[1]}: a client acting with an ONNX file records Discrete, MultiDiscrete "
                "and float Box actions"
            )
        self.built: BuiltPolicy = build_policy(spec, *spaces, imports)
        writes = [type(p).__name__ for p in self.built.env_to_module.connectors if type(p) not in _KEEPS_OBSERVATIONS]
        if writes:
            raise NotExportable(
                f"the run's env-to-module pipeline rewrites observations ({', '.join(writes)}): a client acting "
                "with an ONNX file records the env's own, which the learner would train on"
            )
        pipelines = self.built.env_to_module, self.built.module_to_env
        traced = placeholder(self.built.module)
        graph = policy_graph(pipelines[0], traced, pipelines[1], *spaces, explore=True, module_only=False)
        contract = {
            "rlgate_version": importlib.metadata.version("rlgate"),
            "module_id": DEFAULT_MODULE_ID,
            "explore": True,
            "module_only": False,
            "observation_space": codec.space_to_json(spaces[0]),
            "action_space": codec.space_to_json(spaces[1]),
            "run_spec": spec.model_dump(mode="json"),
        }
        self.graph = onnx.load_from_string(to_onnx(graph, contract, fold_constants=False))
        self.described = json.loads(next(p.value for p in self.graph.metadata_props if p.key == CONTRACT_KEY))
        reference = policy_graph(
            pipelines[0], self.built.module, pipelines[1], *spaces, explore=True, module_only=False
        )
        session = ort.InferenceSession(rebind(self.graph, parameters(self.built.module)), providers=PROVIDERS)
        if not reproduces(reference, session):
            raise NotExportable("the module's exported graph does not reproduce its outputs")
        self._lock = threading.Lock()
        self._last: tuple[int, bytes] | None = None

    def file(self, weights: learner_pb2.Weights) -> bytes:
        """The ONNX file of `weights` (a version of this run), the last one's kept for the next client asking."""
        with self._lock:
            if self._last is not None and self._last[0] == weights.version:
                return self._last[1]
            module = self.built.module
            load_weights(module, weights.safetensors)  # WeightsMismatch for another model's weights
            model = onnx.load_from_string(rebind(self.graph, parameters(module)))
            contract = {**self.described, "model_version": weights.version}
            onnx.helper.set_model_props(model, {CONTRACT_KEY: json.dumps(contract)})
            data = model.SerializeToString()
            self._last = (weights.version, data)
            return data


def _recordable(space: gym.Space) -> bool:
    """Whether a client can record the actions of an ONNX file in `space` as a server does: Discrete and
    MultiDiscrete ones are the file's `actions`; a float Box's the module's own, `module_actions` (an integer Box's
    have no distribution that samples them)."""
    if isinstance(space, gym.spaces.Box):
        return bool(np.issubdtype(space.dtype, np.floating))
    return isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
