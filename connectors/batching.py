"""How a batch column holds its data, and turning a column's items into one batched array."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlgate.core.tree import batch as stack_items
from rlgate.core.tree import first_leaf, map_structure


class BatchedNdArray(np.ndarray):
    """An item that already has a batch axis (from `add_n_batch_items`): batching concatenates it."""


def is_batched(column_data: Any) -> bool:
    """True for an already batched column (a [B, ...] array or a nested dict/tuple of them).

    False for the per-episode forms: a list of items, or a dict `(episode id,) -> [items]`.
    """
    if isinstance(column_data, np.ndarray):  # the fast path's columns: before the (costly) ABC check
        return True
    if isinstance(column_data, list):
        return False
    if isinstance(column_data, dict | Mapping):
        return not column_data or not isinstance(next(iter(column_data)), tuple)
    return True


def batch_items(items: list[Any]) -> Any:
    """Stack a non-empty list of (nested) items into one (nested) array along a new leading axis.

    Items tagged BatchedNdArray already have that axis and are concatenated instead (others get a
    leading axis of 1), so that whole episodes added with `add_n_batch_items` cost one concatenate.
    """
    if not any(isinstance(first_leaf(item), BatchedNdArray) for item in items):
        return stack_items(items)

    def concat(*leaves: Any) -> np.ndarray:
        parts = [np.asarray(x) if isinstance(x, BatchedNdArray) else np.asarray(x)[None] for x in leaves]
        return np.concatenate(parts)

    return map_structure(concat, *items)


def num_rows(column_data: Any) -> int:
    """The batch size of a batched column."""
    return len(first_leaf(column_data))
