"""OnnxForward: the inference server's forward pass (and GetActions' sampling) in onnxruntime (`--backend
onnxruntime`).

The server's env-to-module and module-to-env pieces keep running as ConnectorV2 pieces around it: they write the
observations the learner trains on into the episodes, and MeanStdFilter's statistics move with every batch, so
none of them is folded. The graph is the module and its action selection (`rlgate export --module-only
--explore`'s graph): the noise comes from torch's generator, drawn as the torch backend's distributions draw it,
so a seeded server samples the same actions with either backend.

Each weights version rebinds the graph: it is traced once (with placeholder weights, every parameter an
initializer under its own name), and a newer version's parameters replace those initializers in a new
onnxruntime session, built on a worker thread while the old session goes on acting; the core swaps to it
between batches (`ready`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime as ort
import torch

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.export import contract
from rlgate.export.actions import ActionSelection
from rlgate.export.contract import at, nest
from rlgate.export.graph import PolicyGraph
from rlgate.export.onnx_file import parameters, placeholder, rebind, to_onnx
from rlgate.export.pieces import NotExportable
from rlgate.models import RLModule


class OnnxForward:
    """`forward(batch, explore)`: the outputs the module's acting forward and GetActions give for an env-to-module
    batch (numpy arrays: ACTION_DIST_INPUTS, ACTIONS, ACTION_LOGP when exploring, STATE_OUT; a stateful module's
    with their time axis), from onnxruntime sessions of the module's weights."""

    def __init__(self, module: RLModule, action_space: gym.Space, threads: int):
        self.stateful = module.is_stateful()
        traced = placeholder(module)
        shape = {"observation_space": module.observation_space, "module_only": True}
        self.graphs = {
            explore: PolicyGraph(traced, [], ActionSelection(traced, action_space, explore), **shape)
            for explore in (False, True)
        }
        self.models = {
            explore: onnx.load_from_string(to_onnx(graph, {}, fold_constants=False))
            for explore, graph in self.graphs.items()
        }
        selection = self.graphs[True].selection
        self._exponential, self._noise_width = selection.noise_kind == "exponential", selection.noise_width
        self._options = ort.SessionOptions()
        self._options.intra_op_num_threads = threads
        self._options.inter_op_num_threads = 1
        self.sessions = self._bind(parameters(module))
        for explore in (False, True):
            self._check(PolicyGraph(module, [], ActionSelection(module, action_space, explore), **shape), explore)
        self._binding: Future | None = None
        self._pending = 0
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="onnx-rebind")

    def _bind(self, tensors: dict[str, np.ndarray]) -> dict[bool, ort.InferenceSession]:
        return {
            explore: ort.InferenceSession(rebind(model, tensors), self._options, providers=["CPUExecutionProvider"])
            for explore, model in self.models.items()
        }

    def _check(self, reference: PolicyGraph, explore: bool) -> None:
        if not reproduces(reference, self.sessions[explore]):
            raise NotExportable("the module's exported graph does not reproduce its outputs: use --backend torch")

    def forward(self, batch: dict[str, Any], explore: bool) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        graph = self.graphs[explore]
        if self.stateful:
            obs = map_structure(lambda x: x[:, 0], obs)
        feeds = {
            spec.name: np.asarray(at(obs, path), spec.dtype)
            for spec, (_, path) in zip(graph.inputs, graph.obs_leaves, strict=False)
        }
        rows = len(next(iter(feeds.values())))
        for name, path in graph.module_state_paths.items():
            feeds[contract.STATE_IN + name] = np.asarray(at(batch[Columns.STATE_IN], path))
        if explore:  # drawn as the distributions' `noise()` draws it (Categorical: exponential_, DiagGaussian: randn)
            shape = (rows, self._noise_width)
            feeds[contract.NOISE] = (
                torch.empty(shape).exponential_() if self._exponential else torch.randn(shape)
            ).numpy()
        results = dict(zip([s.name for s in graph.outputs], self.sessions[explore].run(None, feeds), strict=True))
        outputs = {
            Columns.ACTION_DIST_INPUTS: results[contract.ACTION_DIST_INPUTS],
            Columns.ACTIONS: results[contract.ACTIONS],
        }
        if explore:
            outputs[Columns.ACTION_LOGP] = results[contract.ACTION_LOGP]
        if self.stateful:
            outputs = {column: value[:, None] for column, value in outputs.items()}  # the time axis back
            paths = graph.module_state_paths
            outputs[Columns.STATE_OUT] = nest([results[contract.STATE_OUT + n] for n in paths], list(paths.values()))
        return outputs

    def rebind(self, version: int, module: RLModule) -> Future:
        """Act with the module's weights as they are now, as `version`, once `ready` says so: the new sessions
        are built on a worker thread (a binding still running is superseded); the future is done when they are."""
        tensors = parameters(module)  # copied now: the module's weights may change again meanwhile
        self._binding = self._worker.submit(self._bind, tensors)
        self._pending = version
        return self._binding

    def ready(self) -> int | None:
        """The version of a rebinding that has finished, now acting; None while none has."""
        binding = self._binding
        if binding is None or not binding.done():
            return None
        self.sessions = binding.result()
        self._binding = None
        return self._pending


def reproduces(reference: PolicyGraph, session: ort.InferenceSession) -> bool:
    """Whether a session of a rebound graph gives the distribution inputs of `reference` (the graph traced from the
    module itself) on the graph's example inputs: every parameter was rebound (one the trace had renamed would keep
    its placeholder value), and the trace holds (a forward whose path depends on its inputs' values may not)."""
    example = reference.example_inputs()
    with torch.no_grad():
        values = reference(*example)  # (names reference.outputs)
    expected = dict(zip([spec.name for spec in reference.outputs], values, strict=True))
    feeds = {spec.name: x.numpy() for spec, x in zip(reference.inputs, example, strict=True)}
    (got,) = session.run([contract.ACTION_DIST_INPUTS], feeds)
    return bool(np.allclose(got, expected[contract.ACTION_DIST_INPUTS].numpy(), rtol=1e-4, atol=1e-5))
