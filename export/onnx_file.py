"""A PolicyGraph written as an ONNX model: traced with torch.onnx's TorchScript exporter, the contract in its
metadata, and its weights rebound by name for a newer version (the server's backend).

The TorchScript exporter (`dynamo=False`), not torch 2.13's default torch.export-based one, deliberately: it
needs the `onnx` package only (the dynamo exporter needs onnxscript and its own IR package besides), a trace of
rlgate's modules (dicts of tensors in and out, Python-side structure fixed per policy) records exactly the path
the policy takes, and it exports a small policy in well under a second where the dynamo exporter's
export, decomposition and optimisation passes take seconds. Opset 15: what Unity's inference engine reads too.
"""

from __future__ import annotations

import copy
import io
import json
import threading
import warnings
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from rlgate.export.contract import CONTRACT_KEY
from rlgate.export.graph import PolicyGraph
from rlgate.models import RLModule

OPSET = 15
PREFIX = "module."  # the module's parameters' names in the graph (PolicyGraph.module)
# torch.onnx's exporter keeps global state (and warnings filters are process-wide): one export at a time per
# process, or a second thread's (a server and an in-process local client building their cores) fails with
# "GLOBALS.in_onnx_export must be False".
_EXPORTING = threading.Lock()


def to_onnx(graph: PolicyGraph, contract: dict[str, Any], *, fold_constants: bool = True) -> bytes:
    """The graph as an ONNX model (bytes) with a dynamic batch axis, `contract` (with the graph's inputs and
    outputs added) as the `rlgate.contract` metadata. `fold_constants=False` keeps every parameter an initializer
    under its state_dict name (`rebind` needs that)."""
    example = graph.example_inputs()
    with torch.no_grad():
        graph(*example)  # names the outputs
    names = [spec.name for spec in graph.inputs], [spec.name for spec in graph.outputs]
    buffer = io.BytesIO()
    with _EXPORTING, warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter's deprecation notice, and its LSTM note on batch sizes (the state is an input).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*LSTM.*", category=UserWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # constants (space bounds) and LSTM size checks
        torch.onnx.export(
            graph,
            example,
            buffer,  # type: ignore[arg-type]  # the TorchScript exporter (dynamo=False) writes a file object too
            dynamo=False,
            input_names=names[0],
            output_names=names[1],
            dynamic_axes={name: {0: "batch"} for name in [*names[0], *names[1]]},
            opset_version=OPSET,
            do_constant_folding=fold_constants,
        )
    model = onnx.load_from_string(buffer.getvalue())
    described = {
        **contract,
        "inputs": [spec.to_json() for spec in graph.inputs],
        "outputs": [spec.to_json() for spec in graph.outputs],
        "initial_state": {name: value.tolist() for name, value in graph.initial_state.items()},
    }
    if graph.selection.explore:
        described.update(noise_kind=graph.selection.noise_kind, greedy_noise=graph.selection.greedy_noise)
    onnx.helper.set_model_props(model, {CONTRACT_KEY: json.dumps(described)})
    model.producer_name = "rlgate"
    return model.SerializeToString()


def rebind(model: onnx.ModelProto, tensors: dict[str, np.ndarray]) -> bytes:
    """`model` (exported with fold_constants=False) with each initializer named in `tensors` replaced by it."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for i, initializer in enumerate(bound.graph.initializer):
        value = tensors.get(initializer.name)
        if value is not None:
            bound.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, initializer.name))
    return bound.SerializeToString()


def placeholder(module: RLModule) -> RLModule:
    """A copy of `module` to trace a graph that `rebind` takes each version's weights into: every floating-point
    tensor set to distinct values (the exporter merges initializers that are equal, which rebind could not tell
    apart)."""
    copied = copy.deepcopy(module)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in copied.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return copied


def parameters(module: RLModule) -> dict[str, np.ndarray]:
    """The module's weights as `rebind` takes them for a graph traced from its placeholder (copies)."""
    return {PREFIX + name: tensor.detach().cpu().numpy().copy() for name, tensor in module.state_dict().items()}
