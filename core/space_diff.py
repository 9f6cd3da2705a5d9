"""How two gymnasium spaces differ, field by field: for messages that show only what does not match."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def space_differences(expected: gym.Space, actual: gym.Space, path: str) -> list[str]:
    """One line per differing field, `path.field: expected != actual` ([] when the spaces are equal).

    Bounds that differ are shown at their first differing index, so a 1000-element Box stays one line.
    """
    if type(expected) is not type(actual):
        return [f"{path}: {_name(expected)} != {_name(actual)}"]
    if isinstance(expected, gym.spaces.Dict):
        assert isinstance(actual, gym.spaces.Dict)
        if list(expected.spaces) != list(actual.spaces):
            return [f"{path}: keys {list(expected.spaces)} != {list(actual.spaces)}"]
        return [
            line
            for key in expected.spaces
            for line in space_differences(expected[key], actual[key], f'{path}["{key}"]')
        ]
    if isinstance(expected, gym.spaces.Tuple):
        assert isinstance(actual, gym.spaces.Tuple)
        if len(expected.spaces) != len(actual.spaces):
            return [f"{path}: {len(expected.spaces)} items != {len(actual.spaces)}"]
        return [
            line
            for i, (e, a) in enumerate(zip(expected.spaces, actual.spaces, strict=True))
            for line in space_differences(e, a, f"{path}[{i}]")
        ]
    lines = []
    if expected.shape != actual.shape:
        lines.append(f"{path}.shape: {expected.shape} != {actual.shape}")
    if expected.dtype != actual.dtype:
        lines.append(f"{path}.dtype: {expected.dtype} != {actual.dtype}")
    if lines:
        return lines
    fields = {
        gym.spaces.Box: ("low", "high"),
        gym.spaces.Discrete: ("n", "start"),
        gym.spaces.MultiDiscrete: ("nvec", "start"),
    }.get(type(expected), ())
    for field in fields:
        lines.extend(_array_difference(getattr(expected, field), getattr(actual, field), f"{path}.{field}"))
    if not lines and expected != actual:  # anything the fields above do not cover
        lines.append(f"{path}: {expected} != {actual}")
    return lines


def _array_difference(expected: object, actual: object, path: str) -> list[str]:
    e, a = np.asarray(expected), np.asarray(actual)
    same = e == a
    if e.dtype.kind == "f" and a.dtype.kind == "f":
        same |= np.isnan(e) & np.isnan(a)
    differs = ~same
    if not differs.any():
        return []
    if e.ndim == 0:
        return [f"{path}: {e} != {a}"]
    index = tuple(int(i) for i in np.argwhere(differs)[0])
    more = int(differs.sum()) - 1
    return [f"{path}{list(index)}: {e[index]} != {a[index]}" + (f" (and {more} more)" if more else "")]


def _name(space: gym.Space) -> str:
    return type(space).__name__
