"""The tensor contract of an exported policy: input and output names, and the metadata that describes them.

Every exported graph has a dynamic batch axis first on every input and output. Names (docs/onnx.md says what each
holds):

- `obs` (one observation leaf) or `obs.<key>` / `obs.<i>` (one input per leaf of a Dict or Tuple space, nested
  keys joined by dots), in the env's dtype;
- `reward`: the reward the env paid for the previous action (0 at a reset), where a folded piece needs it;
- `state_in.<name>` / `state_out.<name>`: state carried from one step to the next (stacked frames, previous
  actions and rewards, a recurrent module's state), starting at the file's initial state;
- `noise` (files exported with --explore): the random draws the action is sampled from;
- `actions` (for the env), `action_logp` (explore), `action_dist_inputs` (the module's distribution inputs),
  `module_actions` (explore files whose `actions` are made fit for the env: the module's own, which episodes record).

The file's `metadata_props` hold `rlgate.contract`, one JSON object: the inputs and outputs (name, dtype,
shape, what it holds), the initial state, the noise, the spaces, the run spec and versions. This module imports
neither torch nor onnx: `runtime` reads the contract with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym

from rlgate.core.spaces import space_struct

OBS = "obs"
REWARD = "reward"
NOISE = "noise"
ACTIONS = "actions"
ACTION_LOGP = "action_logp"
ACTION_DIST_INPUTS = "action_dist_inputs"
MODULE_ACTIONS = "module_actions"
STATE_IN = "state_in."
STATE_OUT = "state_out."
#: The metadata key whose value is the contract (JSON).
CONTRACT_KEY = "rlgate.contract"
#: The batch axis' name in the contract's shapes.
BATCH = "batch"


def leaf_paths(space: gym.Space, prefix: str = OBS) -> list[tuple[str, tuple]]:
    """(input name, path of keys/indices) for each leaf of `space`, in the order `core.tree.flatten` visits it:
    `[("obs", ())]` for a flat space, `[("obs.a", ("a",)), ("obs.b.0", ("b", 0))]` for nested ones."""

    def walk(struct: Any, name: str, path: tuple) -> list[tuple[str, tuple]]:
        if isinstance(struct, dict):
            return [leaf for key, sub in struct.items() for leaf in walk(sub, f"{name}.{key}", (*path, key))]
        if isinstance(struct, tuple):
            return [leaf for i, sub in enumerate(struct) for leaf in walk(sub, f"{name}.{i}", (*path, i))]
        return [(name, path)]

    return walk(space_struct(space), prefix, ())


def state_names(state: dict[str, Any], prefix: str = "") -> list[tuple[str, tuple]]:
    """(name, path) for each leaf of a (nested) state dict: `{"h": .., "c": ..}` -> [("h", ("h",)), ...]."""
    names = []
    for key, value in state.items():
        if isinstance(value, dict):
            names += [(name, (key, *path)) for name, path in state_names(value, f"{prefix}{key}.")]
        else:
            names.append((f"{prefix}{key}", (key,)))
    return names


def at(struct: Any, path: tuple) -> Any:
    """The leaf of a nested struct at a path of keys (the struct itself at path ())."""
    for key in path:
        struct = struct[key]
    return struct


def nest(leaves: list[Any], paths: list[tuple]) -> Any:
    """The nested structure whose leaf at each path is the leaf given (a single leaf at path ())."""
    if paths == [()]:
        return leaves[0]
    root: dict = {}
    for leaf, path in zip(leaves, paths, strict=True):
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return _tuples(root)


def _tuples(node: Any) -> Any:
    """Dicts keyed 0..n-1 by int as tuples (a Tuple space's leaves)."""
    if not isinstance(node, dict):
        return node
    items = {key: _tuples(value) for key, value in node.items()}
    if items and all(isinstance(key, int) for key in items):
        return tuple(items[i] for i in range(len(items)))
    return items


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the graph: its name, numpy dtype name, shape (the batch axis first, as BATCH) and
    what it holds."""

    name: str
    dtype: str
    shape: tuple
    doc: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data["doc"])
