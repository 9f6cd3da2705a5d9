"""Checkpoints on disk: everything needed to resume training, or to serve the policy with no learner.

Layout of `DIR/v000042/`: `spec.json` (the run spec: pass it back with `--config`),
`weights.safetensors` (the module), `optimizer.safetensors` (PPO's Adam moment tensors; DQN's and SAC's
optimizers, target networks and alpha are in `learner_state.safetensors`, and with `store_buffer_in_checkpoints`
their replay buffer in `replay_buffer.safetensors`), `connector_state.pb`
(e.g. MeanStdFilter statistics, as an `rlgate.v1.Value`: the wire codec's nested arrays) and
`metadata.json` (plain JSON a person can read: version, env id, seed, the env's spaces, the rlgate version
that wrote it, optimizer hyper-parameters, the ids of trained episode chunks and of those dropped as too stale
to train, the env steps trained on by all updates up to this version, the learner's mean return then). A
multi-agent run keeps each module in `modules/<module id>/` (its `weights.safetensors` and
`optimizer.safetensors`), with each module's version in `metadata.json`, and its spaces are Dicts by agent id.
`DIR/latest` names the newest one. No pickle anywhere, and loading imports nothing: a checkpoint from an
untrusted source can at worst fail to load (the code its spec names is imported later, only where the
operator allowed it).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from google.protobuf.message import DecodeError
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load as load_numpy
from safetensors.numpy import save as save_numpy
from safetensors.torch import load as load_torch
from safetensors.torch import save as save_torch

from rlgate.core import codec
from rlgate.core.errors import UserError
from rlgate.models.weights import WeightsMismatch
from rlgate.spec.run import RunSpec
from rlgate.v1 import tensor_pb2

LATEST = "latest"


#: Tensors (or numpy arrays) by name and the plain JSON data beside them: a learner's state or a replay buffer's.
State = tuple[dict[str, Any], dict[str, Any]]


class Optimizer(Protocol):
    """What a checkpoint needs of an optimizer: its state dict in torch.optim's format (learner.adam.Adam's,
    or a torch.optim optimizer's)."""

    def state_dict(self) -> dict[str, Any]: ...


class CheckpointNotFound(UserError, FileNotFoundError):
    """No usable checkpoint where one was asked for (e.g. `rlgate serve --checkpoint DIR`)."""


class CorruptCheckpoint(UserError, ValueError):
    """A checkpoint file that is missing or does not parse: the message names the file and what is wrong."""


class CheckpointMismatch(UserError, ValueError):
    """A checkpoint's weights that do not fit the model its run spec builds here (weights copied from another
    run, an edited spec.json): the message names the file and the first tensor that differs."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: plain data, from which a server or learner builds its module."""

    version: int
    directory: Path  # the checkpoint's own folder (v000042), to name its files in errors
    spec: RunSpec
    observation_space: gym.Space  # the env's spaces (the module's follow from the env-to-module pipeline)
    action_space: gym.Space
    weights: bytes
    connector_state: dict[str, Any]
    optimizer_state: dict[str, Any] | None
    trained_chunks: list[str]
    partial_chunks: dict[str, int]  # chunk key -> its first steps trained (a chunk split between two updates)
    env_steps: int  # trained on by the updates that led to these weights: the trained chunks' and partial ones' steps
    module_weights: dict[str, bytes] | None = None  # multi-agent: per module (weights is then empty)
    module_versions: dict[str, int] | None = None
    module_optimizer_states: dict[str, dict[str, Any]] | None = None
    stale_chunks: list[str] = field(default_factory=list)  # dropped as too stale to train (bar a split one's head)
    mean_return: float | None = None  # the learner's mean return of its last episodes when it wrote this one
    learner_state: State | None = None  # DQN, SAC: the trainer's optimizers, target networks, alpha, counters
    replay_buffer: State | None = None  # DQN, SAC with store_buffer_in_checkpoints: the replay buffer's steps

    @contextmanager
    def loading_weights(self) -> Iterator[None]:
        """Weights of this checkpoint loaded inside that do not fit their module (load_weights' WeightsMismatch)
        end as one CheckpointMismatch naming the weights file and what differs."""
        try:
            yield
        except WeightsMismatch as exc:
            files = "modules/*/weights.safetensors" if self.module_weights is not None else "weights.safetensors"
            raise CheckpointMismatch(
                f"checkpoint file {self.directory / files} does not fit the model its spec.json builds: "
                f"{' '.join(str(exc).split())}"
            ) from None


def save(
    directory: Path,
    *,
    version: int,
    spec: RunSpec,
    observation_space: gym.Space,
    action_space: gym.Space,
    weights: bytes | dict[str, bytes],
    optimizer: Optimizer | Mapping[str, Optimizer] | None = None,
    connector_state: dict[str, Any] | None = None,
    trained_chunks: list[str] | None = None,
    stale_chunks: list[str] | None = None,
    partial_chunks: dict[str, int] | None = None,
    env_steps: int = 0,
    module_versions: dict[str, int] | None = None,
    mean_return: float | None = None,
    learner_state: State | None = None,
    replay_buffer: State | None = None,
) -> Path:
    """Write checkpoint `version` atomically (temp dir, then rename) and point `latest` at it. Multi-agent:
    `weights` and `optimizer` by module id, with `module_versions`. DQN and SAC: `learner_state` (torch tensors and
    JSON data: `learner_state.safetensors`) and optionally `replay_buffer` (numpy arrays and JSON data:
    `replay_buffer.safetensors`)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"v{version:06d}"
    tmp = directory / f".tmp-v{version:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if isinstance(weights, bytes):
        (tmp / "weights.safetensors").write_bytes(weights)
    (tmp / "spec.json").write_text(spec.model_dump_json(indent=2))
    (tmp / "connector_state.pb").write_bytes(codec.to_value(connector_state or {}).SerializeToString())
    metadata: dict[str, Any] = {
        "version": version,
        "env_id": spec.env.id,
        "seed": spec.seed,
        "rlgate_version": importlib.metadata.version("rlgate"),
        "observation_space": codec.space_to_json(observation_space),
        "action_space": codec.space_to_json(action_space),
        "trained_chunks": trained_chunks or [],
        "stale_chunks": stale_chunks or [],
        "partial_chunks": partial_chunks or {},
        "env_steps": env_steps,
        "mean_return": mean_return,
    }
    if isinstance(weights, dict):
        metadata["modules"] = {}
        for module_id, module_weights in weights.items():
            folder = tmp / "modules" / module_id
            folder.mkdir(parents=True)
            (folder / "weights.safetensors").write_bytes(module_weights)
            entry: dict[str, Any] = {"version": (module_versions or {}).get(module_id, 0)}
            metadata["modules"][module_id] = entry
            if isinstance(optimizer, Mapping) and module_id in optimizer:
                tensors, entry["optimizer"] = optimizer_to_tensors(optimizer[module_id])
                (folder / "optimizer.safetensors").write_bytes(save_torch(tensors))
    elif optimizer is not None:
        assert not isinstance(optimizer, Mapping)  # optimizers by module come with weights by module
        tensors, metadata["optimizer"] = optimizer_to_tensors(optimizer)
        (tmp / "optimizer.safetensors").write_bytes(save_torch(tensors))
    if learner_state is not None:
        tensors, metadata["learner_state"] = learner_state
        (tmp / "learner_state.safetensors").write_bytes(save_torch({k: v.contiguous() for k, v in tensors.items()}))
    if replay_buffer is not None:
        arrays, metadata["replay_buffer"] = replay_buffer
        (tmp / "replay_buffer.safetensors").write_bytes(
            save_numpy({k: np.ascontiguousarray(v) for k, v in arrays.items()})
        )
    (tmp / "metadata.json").write_text(json.dumps(metadata))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (directory / f".{LATEST}").write_text(final.name)
    os.replace(directory / f".{LATEST}", directory / LATEST)
    return final


def latest(directory: Path) -> Path | None:
    """The newest checkpoint in `directory` (or `directory` itself if it is one), else None. A `latest`
    pointer to a checkpoint that is not there raises CheckpointNotFound: resuming without it would lose it."""
    if (directory / "metadata.json").exists():
        return directory
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    found = directory / pointer.read_text().strip()
    if not (found / "metadata.json").exists():
        raise CheckpointNotFound(f"{pointer} names {found.name}, but {found} holds no checkpoint (no metadata.json)")
    return found


def find(directory: Path) -> Path:
    """The newest checkpoint in `directory`, as `latest`; none there raises CheckpointNotFound, saying why."""
    if not directory.is_dir():
        raise CheckpointNotFound(f"no checkpoint at {directory}: no such directory")
    found = latest(directory)
    if found is None:
        raise CheckpointNotFound(f"no checkpoint in {directory}: expected metadata.json or a 'latest' pointer")
    return found


@contextmanager
def _reading(file: Path) -> Iterator[None]:
    """Turn a checkpoint file that is missing or does not parse into one CorruptCheckpoint naming it."""
    try:
        yield
    except FileNotFoundError:
        raise CorruptCheckpoint(f"checkpoint file {file} is missing") from None
    except (ValueError, KeyError, TypeError, DecodeError, SafetensorError) as exc:
        what = f"no field {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise CorruptCheckpoint(f"checkpoint file {file} is corrupt: {what}") from None


def _weights(file: Path) -> bytes:
    """The file's bytes, once its safetensors header reads: a corrupt file fails here, named, not when loaded."""
    with _reading(file):
        with safe_open(file, framework="pt"):
            pass
        return file.read_bytes()


def _optimizer(file: Path, meta: dict[str, Any]) -> dict[str, Any]:
    with _reading(file):
        return optimizer_from_tensors(load_torch(file.read_bytes()), meta)


def load(path: Path) -> Checkpoint:
    """Load a checkpoint directory written by `save` (or a folder whose `latest` points to one). A file that
    is missing or corrupt raises CorruptCheckpoint naming it."""
    found = find(path)
    spec_file = found / "spec.json"
    if not spec_file.exists():
        raise CheckpointNotFound(f"{found} has no spec.json: it was written by an rlgate from before run specs")
    metadata_file = found / "metadata.json"
    with _reading(metadata_file):
        metadata = json.loads(metadata_file.read_text())
        modules = metadata.get("modules")
        fields: dict[str, Any] = {  # Checkpoint's fields read from the metadata, checked by their conversions
            "version": int(metadata["version"]),
            "observation_space": codec.space_from_json(metadata["observation_space"]),
            "action_space": codec.space_from_json(metadata["action_space"]),
            "module_versions": None if modules is None else {m: int(e["version"]) for m, e in modules.items()},
            "trained_chunks": list(metadata.get("trained_chunks", [])),
            "stale_chunks": list(metadata.get("stale_chunks", [])),
            "partial_chunks": {str(k): int(v) for k, v in metadata.get("partial_chunks", {}).items()},
            "env_steps": int(metadata.get("env_steps", 0)),
            "mean_return": None if metadata.get("mean_return") is None else float(metadata["mean_return"]),
        }
    connector_file = found / "connector_state.pb"
    with _reading(connector_file):
        connector_state = codec.from_value(tensor_pb2.Value.FromString(connector_file.read_bytes()), "connector_state")
    return Checkpoint(
        directory=found,
        spec=RunSpec.from_json(spec_file.read_text(), str(spec_file)),
        weights=b"" if modules is not None else _weights(found / "weights.safetensors"),
        module_weights=None
        if modules is None
        else {m: _weights(found / "modules" / m / "weights.safetensors") for m in modules},
        module_optimizer_states=None
        if modules is None
        else {
            m: _optimizer(found / "modules" / m / "optimizer.safetensors", entry["optimizer"])
            for m, entry in modules.items()
            if "optimizer" in entry
        },
        connector_state=connector_state,
        optimizer_state=_optimizer(found / "optimizer.safetensors", metadata["optimizer"])
        if "optimizer" in metadata
        else None,
        learner_state=_state(found / "learner_state.safetensors", metadata, "learner_state", load_torch),
        replay_buffer=_state(found / "replay_buffer.safetensors", metadata, "replay_buffer", load_numpy),
        **fields,
    )


def _state(file: Path, metadata: dict[str, Any], key: str, load: Any) -> State | None:
    """A learner's or replay buffer's file and its JSON part in metadata.json, if the checkpoint has them."""
    if key not in metadata:
        return None
    with _reading(file):
        return load(file.read_bytes()), metadata[key]


def optimizer_to_tensors(optimizer: Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors (safetensors) and plain values (JSON)."""
    state = optimizer.state_dict()
    tensors = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_id, param_state in state["state"].items():
        for key, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"{param_id}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(param_id), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        param_id, key = name.split("/", 1)
        state.setdefault(int(param_id), {})[key] = value
    for param_id, values in meta["scalars"].items():
        state.setdefault(int(param_id), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}
