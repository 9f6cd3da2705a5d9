"""SpaceCheck: a gymnasium space prepared once, to decode and check many wire values against it.

A session builds one per column at hello, so a step message costs, per leaf of its observation, one
dtype, shape and length comparison and one bounds test, with no space logic looked up per call. Small
leaves (up to `SMALL` elements, e.g. a one-env CartPole message) are tested in Python over lists of
bounds, which is several times cheaper than numpy's per-call cost; larger ones with numpy.

What a value may be (proto/README.md says the same to client authors):
- Box of a float dtype: any float dtype on the wire, converted to the space's dtype. Values must be finite
  and within the bounds; NaN never passes, +-inf only with `allow_infinite` where the bound is infinite.
- Box of an integer dtype, Discrete, MultiDiscrete: any integer dtype, values within the bounds (or the
  range), converted to the space's dtype.
- MultiBinary: bool or any integer dtype, values 0 and 1, converted to the space's dtype.
- Dict and Tuple: the same keys / number of items as the space, each checked as above.
Every value has a leading axis of `rows` (the sub-envs), or none where `rows` is None (one value: a
multi-agent step's observation of one agent). Rejections raise `CodecError` (`NonFiniteError`
for NaN and infinities), naming the path and the mismatch.
"""

from __future__ import annotations

import operator
from itertools import islice
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.codec import DTYPES, CodecError, check_bool_bytes, wire_code
from rlgate.v1 import tensor_pb2 as pb

# Leaves with at most this many elements are tested in Python (see the module docstring).
SMALL = 128
# Doubles of this magnitude or more round to +-inf as float32: its largest value plus half a unit in the last place.
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def finite_as_float32(value: float) -> bool:
    """Whether a double stays finite as float32, the dtype episodes store rewards in (1e300 does not, NaN does not)."""
    return abs(value) < _FLOAT32_OVERFLOW


class NonFiniteError(CodecError):
    """A NaN or an infinity where the contract forbids it (counted apart: it could poison training).

    `field` is the column it was found in (the SpaceCheck's path: "obs", "reward").
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class SpaceCheck:
    """Decodes `rows` values of `space` ([rows, ...] per leaf; one value if `rows` is None) from a Value message
    and checks them.

    `path` names the column in error messages (`obs`, `reward`, ...). `allow_infinite` lets +-inf pass
    in float Box leaves whose bound on that side is infinite (NaN never passes).
    """

    def __init__(self, space: gym.Space, *, path: str = "obs", allow_infinite: bool = False) -> None:
        self.space = space
        self.path = path
        self._root = _node(space, path, allow_infinite)

    def decode(self, value: pb.Value, rows: int | None) -> Any:
        """The arrays (nested as the space is), in the space's dtypes; CodecError on any mismatch."""
        try:
            return self._root.decode(value, rows)
        except NonFiniteError as exc:
            exc.field = self.path
            raise

    def decode_tensor(self, tensor: pb.Tensor, rows: int | None) -> np.ndarray:
        """Like `decode`, for a flat space given as a bare Tensor (rewards)."""
        root = self._root
        if not isinstance(root, _Leaf):
            raise TypeError(f"{self.space} is not a flat space")
        try:
            return root.tensor(tensor, rows)
        except NonFiniteError as exc:
            exc.field = self.path
            raise


class FlagsCheck:
    """Decodes a bool [rows] tensor (terminated, truncated); the last one decoded is reused for the same bytes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._last_data = b""
        self._last = np.empty(0, np.bool_)

    def decode_tensor(self, tensor: pb.Tensor, rows: int) -> np.ndarray:
        path = self._path
        if tensor.dtype != pb.DTYPE_BOOL:
            raise CodecError(f"{path}: dtype {_wire_name(tensor.dtype)} is not bool")
        if len(tensor.shape) != 1 or tensor.shape[0] != rows:
            raise CodecError(f"{path}: shape {tuple(tensor.shape)} != ({rows},)")
        data = tensor.data
        if len(data) != rows:
            raise CodecError(f"{path}: {len(data)} data bytes != {rows} for shape ({rows},) of bool")
        if data != self._last_data:
            check_bool_bytes(data, path)
            self._last_data, self._last = data, np.ndarray((rows,), np.bool_, data)
        return self._last


def _node(space: gym.Space, path: str, allow_infinite: bool) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return _Dict({k: _node(s, f'{path}["{k}"]', allow_infinite) for k, s in space.spaces.items()}, path)
    if isinstance(space, gym.spaces.Tuple):
        return _Tuple([_node(s, f"{path}[{i}]", allow_infinite) for i, s in enumerate(space.spaces)], path)
    return _Leaf(space, path, allow_infinite)


class _Dict:
    def __init__(self, items: dict[str, Any], path: str) -> None:
        self._items = items
        self._keys = set(items)
        self._path = path

    def decode(self, value: pb.Value, rows: int | None) -> dict[str, Any]:
        if value.WhichOneof("kind") != "dict":
            raise CodecError(f"{self._path}: expected a dict, got {_kind(value)}")
        items = value.dict.items
        # Sizes first: a message's dict may hold a million keys, and building their set alone would take a while.
        if len(items) != len(self._keys) or not all(key in items for key in self._keys):
            raise CodecError(f"{self._path}: keys {_some_keys(items)} != {sorted(self._keys)}")
        return {key: node.decode(items[key], rows) for key, node in self._items.items()}


class _Tuple:
    def __init__(self, items: list[Any], path: str) -> None:
        self._items = items
        self._path = path

    def decode(self, value: pb.Value, rows: int | None) -> tuple:
        if value.WhichOneof("kind") != "tuple":
            raise CodecError(f"{self._path}: expected a tuple, got {_kind(value)}")
        items = value.tuple.items
        if len(items) != len(self._items):
            raise CodecError(f"{self._path}: {len(items)} items != {len(self._items)}")
        return tuple(node.decode(item, rows) for node, item in zip(self._items, items, strict=True))


class _Leaf:
    """One array-valued space: its dtype, shape and bounds prepared as arrays and lists."""

    def __init__(self, space: gym.Space, path: str, allow_infinite: bool) -> None:
        self._path = path
        self._space = space
        self.dtype = np.dtype(space.dtype)
        self._code = wire_code(self.dtype)
        assert space.shape is not None  # every leaf space (Box, Discrete, MultiDiscrete, MultiBinary) has a shape
        self._shape = tuple(space.shape)
        self._row_size = int(np.prod(self._shape, dtype=np.int64))
        self._float = self.dtype.kind == "f"
        kinds: str
        if self._float or self.dtype.kind == "b":
            kinds = self.dtype.kind
        elif isinstance(space, gym.spaces.MultiBinary):
            kinds = "biu"
        else:
            kinds = "iu"
        self._kinds = kinds
        self._accepted = {code: dtype for code, dtype in DTYPES.items() if dtype.kind in kinds and code != self._code}
        low, high = _bounds(space)
        if self._float and not allow_infinite:  # infinities fail the bounds test like any value outside them
            limit = np.finfo(self.dtype).max
            low, high = np.maximum(low, -limit), np.minimum(high, limit)
        self._low, self._high = low.astype(self.dtype), high.astype(self.dtype)
        # Nothing to test in the space's own dtype: bools, and integers whose bounds are their dtype's range.
        self._unbounded = kinds == "b" or (kinds != "f" and _is_full_range(low, high, self.dtype))
        self._last_data, self._last_code, self._last = b"", -1, np.empty(0)  # the last value decoded, and from what
        self._rows: int | None = -1  # the row count of the shape and bound lists below (a session's is fixed)
        self._expected: tuple[int, ...] = ()
        self._lows: list[Any] = []
        self._highs: list[Any] = []

    def decode(self, value: pb.Value, rows: int | None) -> np.ndarray:
        if value.WhichOneof("kind") != "tensor":
            raise CodecError(f"{self._path}: expected a tensor, got {_kind(value)}")
        return self.tensor(value.tensor, rows)

    def tensor(self, tensor: pb.Tensor, rows: int | None) -> np.ndarray:
        if rows != self._rows:
            self._prepare(rows)
        code = tensor.dtype
        dtype = self.dtype if code == self._code else self._accepted.get(code)
        if dtype is None:
            raise CodecError(
                f"{self._path}: dtype {_wire_name(code)} does not fit {_space_name(self._space)} of {self.dtype.name} "
                f"({self._rule()})"
            )
        shape = tuple(tensor.shape)
        if shape != self._expected:
            raise CodecError(f"{self._path}: shape {shape} != {self._expected}")
        data = tensor.data
        if len(data) != self._size * dtype.itemsize:
            raise CodecError(
                f"{self._path}: {len(data)} data bytes != {self._size * dtype.itemsize} for shape {shape} of "
                f"{dtype.name}"
            )
        if data == self._last_data and code == self._last_code:  # as the previous message's (rewards, often)
            return self._last
        if dtype.kind == "b":
            check_bool_bytes(data, self._path)
        array = np.ndarray(shape, dtype, data)  # read-only, on the message's bytes
        if dtype is self.dtype:
            if not self._unbounded:
                self._check(array)
        elif self._float:  # converted first: a value the space's dtype cannot hold becomes inf and fails
            with np.errstate(over="ignore"):
                array = array.astype(self.dtype)
            self._check(array)
            array.flags.writeable = False
        else:
            self._check(array)  # integers in the wire's dtype: the conversion must not wrap around
            array = array.astype(self.dtype)
            array.flags.writeable = False
        self._last_data, self._last_code, self._last = data, code, array
        return array

    def _prepare(self, rows: int | None) -> None:
        self._rows = rows
        self._expected = self._shape if rows is None else (rows, *self._shape)
        self._size = self._row_size if rows is None else rows * self._row_size
        if self._size <= SMALL:
            self._lows = np.broadcast_to(self._low, self._expected).ravel().tolist()
            self._highs = np.broadcast_to(self._high, self._expected).ravel().tolist()

    def _check(self, array: np.ndarray) -> None:
        if self._size <= SMALL:
            values = array.ravel().tolist()
            ok = all(map(operator.le, self._lows, values)) and all(map(operator.le, values, self._highs))
        else:
            ok = bool(((array >= self._low) & (array <= self._high)).all())
        if not ok:
            raise self._rejection(array)

    def _rejection(self, array: np.ndarray) -> CodecError:
        """What is wrong with a value that failed the bounds test (the slow path, once per bad message)."""
        path = self._path
        if self._float:
            nan = np.isnan(array)
            if nan.any():
                return NonFiniteError(f"{path}: NaN at index {_first(nan)}")
            infinite = np.isinf(array)
            if infinite.any():
                index = _first(infinite)
                return NonFiniteError(f"{path}: value {array[index]} at index {index} is not finite")
        outside = (array < self._low) | (array > self._high)
        index = _first(outside)
        within = index[array.ndim - len(self._shape) :]  # the index inside one value (after the rows axis)
        low, high = np.broadcast_to(self._low, self._shape), np.broadcast_to(self._high, self._shape)
        return CodecError(
            f"{path}: value {array[index]} at index {index} outside the {_space_name(self._space)} bounds "
            f"[{low[within]}, {high[within]}]"
        )

    def _rule(self) -> str:
        return "send " + {"f": "a float", "b": "bool", "iu": "an integer", "biu": "bool or an integer"}[self._kinds]


def _bounds(space: gym.Space) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive bounds of a leaf space, broadcastable to its shape."""
    if isinstance(space, gym.spaces.Box):
        return np.asarray(space.low), np.asarray(space.high)
    if isinstance(space, gym.spaces.Discrete):
        start = np.asarray(space.start, np.int64)
        return start, start + np.int64(space.n) - 1
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start, np.int64)
        return start, start + space.nvec.astype(np.int64) - 1
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros((), np.int64), np.ones((), np.int64)
    raise CodecError(f"unsupported space {space}")


def _is_full_range(low: np.ndarray, high: np.ndarray, dtype: np.dtype) -> bool:
    info = np.iinfo(dtype)
    return bool(np.all(low <= info.min) and np.all(high >= info.max))


def _some_keys(keys: Any) -> str:
    """Up to 10 of a message's dict keys, sorted, and how many more: a message may hold a million."""
    shown = sorted(islice(keys, 10))
    more = len(keys) - len(shown)
    return f"{shown} and {more} more" if more else str(shown)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _wire_name(code: pb.DType.ValueType) -> str:
    dtype = DTYPES.get(code)
    if dtype is not None:
        return dtype.name
    return "unset (DTYPE_UNSPECIFIED)" if code == pb.DTYPE_UNSPECIFIED else f"{code} (unknown)"


def _space_name(space: gym.Space) -> str:
    return type(space).__name__


def _kind(value: pb.Value) -> str:
    kind = value.WhichOneof("kind")
    return "nothing (missing value)" if kind is None else f"a {kind}"
