"""Row operations on batched values: arrays, or dicts / tuples of arrays sharing a leading axis."""

from typing import Any

import numpy as np


def row(value: Any, i: int) -> Any:
    """Row i of every array in the nesting."""
    if isinstance(value, dict):
        return {k: row(v, i) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(row(v, i) for v in value)
    return value[i]


def slice_rows(value: Any, start: int, stop: int) -> Any:
    """Rows start:stop of every array in the nesting (views, no copy)."""
    if isinstance(value, dict):
        return {k: slice_rows(v, start, stop) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(slice_rows(v, start, stop) for v in value)
    return value[start:stop]


def concat_rows(values: list[Any]) -> Any:
    """Stack the rows of several equally nested values into one (no copy for a single value)."""
    first = values[0]
    if len(values) == 1:
        return first
    if isinstance(first, dict):
        return {k: concat_rows([v[k] for v in values]) for k in first}
    if isinstance(first, tuple):
        return tuple(concat_rows([v[j] for v in values]) for j in range(len(first)))
    return np.concatenate(values)
