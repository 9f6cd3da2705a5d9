"""Nested data (dicts and tuples of arrays) as episodes hold it: map, flatten, batch and unbatch.

Only `Mapping` and `tuple` count as nesting; everything else (arrays, numbers, lists) is a leaf. This is
the small part of dm-tree that episodes need, keeping dict key order as given.

The functions on the hot path look for a numpy array (the usual leaf) and a dict before asking `Mapping`:
`isinstance(x, Mapping)` is an ABC check, a Python-level call (`ABCMeta.__instancecheck__`) that costs
about ten plain type checks, and they run several times per step message and per shipped episode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def map_structure(fn: Callable[..., Any], *structs: Any) -> Any:
    """Apply `fn` to the leaves of `structs` (all of the first struct's shape), keeping the nesting."""
    first = structs[0]
    if isinstance(first, np.ndarray):
        return fn(*structs)
    if isinstance(first, dict | Mapping):
        if len(structs) == 1:  # the usual call: a generator and argument unpacking per key cost 3x the rest
            return {key: map_structure(fn, value) for key, value in first.items()}
        return {key: map_structure(fn, *(s[key] for s in structs)) for key in first}
    if isinstance(first, tuple):
        return tuple(map_structure(fn, *items) for items in zip(*structs, strict=True))
    return fn(*structs)


def flatten(struct: Any) -> list[Any]:
    """The leaves of `struct`, depth first, in key order."""
    if isinstance(struct, np.ndarray):
        return [struct]
    if isinstance(struct, dict | Mapping):
        return [leaf for value in struct.values() for leaf in flatten(value)]
    if isinstance(struct, tuple):
        return [leaf for value in struct for leaf in flatten(value)]
    return [struct]


def first_leaf(struct: Any) -> Any:
    """The first leaf of `struct` (without building the whole flat list)."""
    while not isinstance(struct, np.ndarray) and isinstance(struct, dict | tuple | Mapping):
        struct = struct[0] if isinstance(struct, tuple) else next(iter(struct.values()))
    return struct


def stack(leaves: list[Any]) -> np.ndarray:
    """Stack equally shaped leaves (arrays or scalars) along a new leading axis.

    Numeric numpy scalars take the first one's dtype (as numpy-mode appends do); Python numbers, arrays
    and anything else follow numpy's type promotion.
    """
    first = leaves[0]
    if isinstance(first, np.ndarray) and first.ndim > 0:
        # One C loop over the flat items is several times faster than np.stack for many small arrays.
        return np.concatenate(leaves).reshape(len(leaves), *first.shape)
    if isinstance(first, np.number | np.bool_):
        # A known dtype spares numpy the type discovery over all items (about 2x faster).
        return np.array(leaves, dtype=first.dtype)
    return np.asarray(leaves)


def batch(items: list[Any]) -> Any:
    """Turn a non-empty list of equally nested items into one nested struct of stacked arrays."""
    if not isinstance(items[0], Mapping | tuple):
        return stack(items)
    return map_structure(lambda *leaves: stack(list(leaves)), *items)


def unbatch(struct: Any) -> list[Any]:
    """The inverse of `batch`: a list of items, one per row of the leading axis."""
    n = len(first_leaf(struct))
    if not isinstance(struct, Mapping | tuple):
        return list(struct)
    return [map_structure(lambda leaf, i=i: leaf[i], struct) for i in range(n)]
