"""What rlgate needs from gymnasium spaces: leaf structure, fill values and one-hot encoding (for lookback
buffers), and a space's flat size (to bound the model a client may ask for)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.tree import map_structure

# Checked first: gymnasium's Dict and Tuple spaces are also Mapping and Sequence, so checking for them is
# an ABC check (a Python-level call), and every lookback buffer an episode is built with asks.
_COMMON_LEAVES = (gym.spaces.Box, gym.spaces.Discrete)


def space_struct(space: gym.Space | None) -> Any:
    """The nesting of a Dict/Tuple space with its leaf spaces as leaves (the space itself if flat)."""
    if space is None or isinstance(space, _COMMON_LEAVES):
        return space
    if isinstance(space, gym.spaces.Dict):
        return {key: space_struct(sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(space_struct(sub) for sub in space.spaces)
    return space


def fill_for_space(
    space: gym.Space, fill: Any, batch_size: int | None = None, *, one_hot_discrete: bool = False
) -> Any:
    """An item (or a batch of `batch_size` items) of `space` with every value set to `fill`.

    With `one_hot_discrete`, Discrete and MultiDiscrete leaves take their one-hot shape, so `fill=0`
    gives zero-hot vectors (all slots zero), as RLlib does.
    """
    lead = () if batch_size is None else (batch_size,)

    def leaf(sub: gym.Space) -> np.ndarray:
        if one_hot_discrete and isinstance(sub, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            return np.full((*lead, _one_hot_depth(sub)), fill, dtype=np.float32)
        assert sub.shape is not None  # a leaf space has a shape
        return np.full((*lead, *sub.shape), fill, dtype=sub.dtype)

    return map_structure(leaf, space_struct(space))


def one_hot(data: Any, struct: Any) -> Any:
    """One-hot encode the Discrete and MultiDiscrete leaves of `data` (float32; other leaves unchanged).

    `data` is an item or a batch (leading axis) of the space whose `space_struct` is `struct`.
    """
    if struct is None:
        raise ValueError("one_hot_discrete=True needs a buffer with a gymnasium space")

    def convert(value: Any, sub: gym.Space) -> Any:
        if isinstance(sub, gym.spaces.Discrete):
            return _one_hot_rows(np.asarray(value) - sub.start, int(sub.n))
        if isinstance(sub, gym.spaces.MultiDiscrete):
            value = np.asarray(value) - sub.start
            flat_nvec = sub.nvec.reshape(-1)
            flat = value.reshape(*value.shape[: value.ndim - sub.nvec.ndim], flat_nvec.size)
            parts = [_one_hot_rows(flat[..., i], int(n)) for i, n in enumerate(flat_nvec)]
            return np.concatenate(parts, axis=-1)
        return value

    return map_structure(convert, data, struct)


def _one_hot_rows(indices: np.ndarray, depth: int) -> np.ndarray:
    """float32 [..., depth] with a 1 at each index: the rows of np.eye(depth) without its depth x depth matrix,
    which for Discrete(30000) alone is 3.6 GB per call."""
    out = np.zeros((*indices.shape, depth), np.float32)
    out.reshape(-1, depth)[np.arange(indices.size), indices.reshape(-1)] = 1.0  # a view: writes into `out`
    return out


def _one_hot_depth(space: gym.spaces.Discrete | gym.spaces.MultiDiscrete) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    return int(np.sum(space.nvec))


def flat_size(space: gym.Space) -> int:
    """Values in one flattened item of `space`, Discrete and MultiDiscrete one-hot (gymnasium's flatdim),
    in Python integers: a space declared by a client cannot overflow it into a small number."""
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
        return math.prod(int(n) for n in space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return sum(int(n) for n in space.nvec.flat)
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        subspaces = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
        return sum(flat_size(sub) for sub in subspaces)
    return int(gym.spaces.flatdim(space))


def has_form_of(space: gym.Space, observation: Any) -> bool:
    """Whether `observation` has `space`'s structure (Dict keys, Tuple length) and leaf shapes; bounds are not
    checked (envs step outside them)."""
    if isinstance(space, gym.spaces.Dict):
        return (
            isinstance(observation, Mapping)
            and set(observation) == set(space.spaces)
            and all(has_form_of(sub, observation[key]) for key, sub in space.spaces.items())
        )
    if isinstance(space, gym.spaces.Tuple):
        return (
            isinstance(observation, tuple)
            and len(observation) == len(space.spaces)
            and all(has_form_of(sub, item) for sub, item in zip(space.spaces, observation, strict=True))
        )
    return not isinstance(observation, Mapping | tuple) and np.shape(observation) == space.shape
