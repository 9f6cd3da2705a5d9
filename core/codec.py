"""The one codec between rlgate.v1 messages and Python data: numpy arrays, nested values, gymnasium spaces.

Tensors travel as dtype + shape + raw little-endian bytes in C order. Decoding never copies: the array
is a read-only view of the message's bytes. Every rejection is a `CodecError` whose message names the
path and the mismatch, e.g. `obs["pos"]: shape (3,) != (2,)`, so a server can hand it to the client as
INVALID_ARGUMENT. Values that must belong to a space (a session's observations) are decoded and checked
by `core.space_check.SpaceCheck`, prepared once per space.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from google.protobuf import json_format, struct_pb2

from rlgate.core.errors import UserError
from rlgate.v1 import tensor_pb2 as pb

# Largest tensor we accept or produce, in elements and dimensions: guards against shapes that would
# make numpy allocate absurd amounts before the length check could catch them.
MAX_ELEMENTS = 1 << 31
MAX_DIMS = 32
# Most spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple, at any depth) decoded from one message: a
# space costs gymnasium microseconds to build, and a 16 MiB hello of a million spaces held a server's event loop
# (every other client) for 11 s.
MAX_SPACES = 1 << 14

#: Wire dtype code -> numpy dtype (little-endian).
DTYPES: dict[pb.DType.ValueType, np.dtype] = {
    pb.DTYPE_BOOL: np.dtype("bool"),
    pb.DTYPE_INT8: np.dtype("<i1"),
    pb.DTYPE_INT16: np.dtype("<i2"),
    pb.DTYPE_INT32: np.dtype("<i4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_UINT8: np.dtype("<u1"),
    pb.DTYPE_UINT16: np.dtype("<u2"),
    pb.DTYPE_UINT32: np.dtype("<u4"),
    pb.DTYPE_UINT64: np.dtype("<u8"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT64: np.dtype("<f8"),
}
# Keyed by the native-order dtype (what numpy hands us); big-endian input is byte-swapped on encode.
_CODES: dict[np.dtype, pb.DType.ValueType] = {dt.newbyteorder("="): code for code, dt in DTYPES.items()}


class CodecError(ValueError):
    """Data from (or for) the wire does not fit the contract; the message says where and how."""


class SpaceBudget:
    """How many more spaces `space_from_proto` may decode: one budget for all the spaces of a message."""

    def __init__(self, spaces: int = MAX_SPACES) -> None:
        self.spaces = spaces
        self.left = spaces

    def take(self, path: str) -> None:
        """Count one space (at `path`); CodecError once the message holds more than the budget."""
        self.left -= 1
        if self.left < 0:
            raise CodecError(
                f"{path}: the message holds more than {self.spaces} spaces (each Box, Discrete, MultiDiscrete, "
                "MultiBinary, Dict and Tuple counts, at any depth, in all its spaces)"
            )


class UnencodableSpace(CodecError, UserError):
    """A space the wire cannot carry (Sequence, Text, Graph, ...): a user's env has it, so it is their
    mistake to fix (e.g. a wrapper), said in one line by the command line, not a traceback."""


# --- tensors ---------------------------------------------------------------------------------------


def wire_code(dtype: np.dtype) -> pb.DType.ValueType:
    """The wire code of a numpy dtype (either byte order); CodecError when it has none."""
    code = _CODES.get(dtype)  # a native-order dtype (nearly always): spares building the "=" one per call
    if code is None:
        code = _CODES.get(dtype.newbyteorder("="))
    if code is None:
        raise CodecError(f"dtype {dtype} has no wire encoding")
    return code


def to_tensor(array: Any) -> pb.Tensor:
    """Encode an array (or anything np.asarray takes) as a Tensor message."""
    tensor = pb.Tensor()
    fill_tensor(tensor, array)
    return tensor


def fill_tensor(tensor: pb.Tensor, array: Any) -> None:
    """Encode an array into `tensor`, a field of the message being built: setting a field's message in place
    costs half what building the Tensor and copying it in (the field's assignment) does."""
    array = np.asarray(array)
    code = wire_code(array.dtype)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    tensor.dtype = code
    tensor.shape[:] = array.shape
    tensor.data = array.tobytes(order="C")


def from_tensor(tensor: pb.Tensor, path: str = "tensor") -> np.ndarray:
    """Decode a Tensor message into a read-only array that shares the message's bytes."""
    dtype = DTYPES.get(tensor.dtype)
    if dtype is None:
        what = "missing (dtype not set)" if tensor.dtype == pb.DTYPE_UNSPECIFIED else f"unknown dtype {tensor.dtype}"
        raise CodecError(f"{path}: {what}")
    shape = tuple(tensor.shape)
    if len(shape) > MAX_DIMS:
        raise CodecError(f"{path}: {len(shape)} dimensions > {MAX_DIMS}")
    if shape and min(shape) < 0:
        raise CodecError(f"{path}: negative dimension in shape {shape}")
    count = math.prod(shape)
    # Zero-sized dimensions included: numpy refuses a shape like (0, 2**62) however few bytes it holds.
    if count > MAX_ELEMENTS or (not count and math.prod(max(d, 1) for d in shape) > MAX_ELEMENTS):
        raise CodecError(f"{path}: shape {shape} has more than {MAX_ELEMENTS} elements")
    data = tensor.data  # read once: each read of a bytes field builds a new bytes object
    if len(data) != count * dtype.itemsize:
        raise CodecError(
            f"{path}: {len(data)} data bytes != {count * dtype.itemsize} for shape {shape} of {dtype.name}"
        )
    if dtype.kind == "b":
        check_bool_bytes(data, path)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def check_bool_bytes(data: bytes, path: str) -> None:
    """The contract's bool is one byte, 0 or 1. numpy reads any other byte as True, but keeps it: it would
    travel on into episodes, episode files and other languages' readers as itself, so it is refused here."""
    if data.translate(None, b"\x00\x01"):
        index = next(i for i, byte in enumerate(data) if byte > 1)
        raise CodecError(f"{path}: bool byte {data[index]} at byte {index}: a bool is one byte, 0 or 1")


# --- nested values ----------------------------------------------------------------------------------


def to_value(data: Any) -> pb.Value:
    """Encode an array, or a dict / tuple / list nesting of arrays, as a Value message."""
    value = pb.Value()
    fill_value(value, data)
    return value


def fill_value(value: pb.Value, data: Any) -> None:
    """Encode `data` (as `to_value`) into `value`, a field of the message being built (see `fill_tensor`)."""
    if isinstance(data, np.ndarray):  # the common case first: cheaper than the abstract Mapping check
        fill_tensor(value.tensor, data)
    elif isinstance(data, Mapping):
        items = value.dict.items
        for key, item in data.items():
            fill_value(items[str(key)], item)
        if not data:
            value.dict.SetInParent()
    elif isinstance(data, tuple | list):
        elements = value.tuple.items
        for item in data:
            fill_value(elements.add(), item)
        if not data:
            value.tuple.SetInParent()
    else:
        fill_tensor(value.tensor, data)


def from_value(value: pb.Value, path: str = "value") -> Any:
    """Decode a Value message into arrays nested in dicts and tuples."""
    kind = value.WhichOneof("kind")
    if kind == "tensor":
        return from_tensor(value.tensor, path)
    if kind == "dict":
        return {k: from_value(v, f'{path}["{k}"]') for k, v in value.dict.items.items()}
    if kind == "tuple":
        return tuple(from_value(v, f"{path}[{i}]") for i, v in enumerate(value.tuple.items))
    raise CodecError(f"{path}: missing value")


# --- infos ------------------------------------------------------------------------------------------


def to_struct(info: Mapping[str, Any]) -> struct_pb2.Struct:
    """Encode an env info dict as a Struct; numpy scalars and arrays become numbers and lists."""
    struct = struct_pb2.Struct()
    struct.update({str(k): _jsonable(v) for k, v in info.items()})
    return struct


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """Decode a Struct into a plain dict (numbers come back as floats, as in JSON).

    By hand rather than with json_format, which refuses NaN and +-inf: legal doubles on the wire, and what an
    env's info may well hold; `to_struct` encodes them back.
    """
    return {key: _from_struct_value(value) for key, value in struct.fields.items()}


def _from_struct_value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [_from_struct_value(item) for item in value.list_value.values]
    return None if kind in (None, "null_value") else getattr(value, kind)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


# --- spaces -----------------------------------------------------------------------------------------


def space_to_proto(space: gym.Space) -> pb.Space:
    """Encode a gymnasium space (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)."""
    if isinstance(space, gym.spaces.Box):
        return pb.Space(box=pb.BoxSpace(low=to_tensor(space.low), high=to_tensor(space.high)))
    if isinstance(space, gym.spaces.Discrete):
        return pb.Space(discrete=pb.DiscreteSpace(n=int(space.n), start=int(space.start)))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return pb.Space(multi_discrete=pb.MultiDiscreteSpace(nvec=to_tensor(space.nvec), start=to_tensor(space.start)))
    if isinstance(space, gym.spaces.MultiBinary):
        return pb.Space(multi_binary=pb.MultiBinarySpace(shape=space.shape))
    if isinstance(space, gym.spaces.Dict):
        entries = [pb.DictSpaceEntry(key=k, space=space_to_proto(s)) for k, s in space.spaces.items()]
        return pb.Space(dict=pb.DictSpace(entries=entries))
    if isinstance(space, gym.spaces.Tuple):
        return pb.Space(tuple=pb.TupleSpace(spaces=[space_to_proto(s) for s in space.spaces]))
    raise UnencodableSpace(f"space {space} has no wire encoding")


def space_from_proto(msg: pb.Space, path: str = "space", budget: SpaceBudget | None = None) -> gym.Space:
    """Decode a Space message, rejecting definitions gymnasium would choke on, and more than `budget`'s spaces (by
    default MAX_SPACES; pass one budget for all the spaces of a message)."""
    budget = budget or SpaceBudget()
    budget.take(path)
    kind = msg.WhichOneof("kind")
    try:
        if kind == "box":
            low = from_tensor(msg.box.low, f"{path}.low")
            high = from_tensor(msg.box.high, f"{path}.high")
            if low.shape != high.shape or low.dtype != high.dtype:
                raise CodecError(f"{path}: low {low.dtype}{low.shape} and high {high.dtype}{high.shape} differ")
            if np.any(low > high):  # bool Boxes included (gymnasium's, Go's board planes): False < True
                raise CodecError(f"{path}: Box needs low <= high")
            return gym.spaces.Box(low=low, high=high, dtype=low.dtype)
        if kind == "discrete":
            if msg.discrete.n <= 0:
                raise CodecError(f"{path}: Discrete needs n > 0, got {msg.discrete.n}")
            if msg.discrete.start + msg.discrete.n - 1 > np.iinfo(np.int64).max:  # as MultiDiscrete's: no wrapping
                raise CodecError(f"{path}: Discrete needs start + n - 1 in int64")
            return gym.spaces.Discrete(msg.discrete.n, start=msg.discrete.start)
        if kind == "multi_discrete":
            nvec = from_tensor(msg.multi_discrete.nvec, f"{path}.nvec")
            start = from_tensor(msg.multi_discrete.start, f"{path}.start")
            if nvec.dtype.kind not in "iu" or np.any(nvec <= 0) or start.shape != nvec.shape:
                raise CodecError(f"{path}: MultiDiscrete needs positive integer nvec and a start of its shape")
            first = start.astype(nvec.dtype) if start.dtype.kind in "iu" else None  # as gymnasium casts it: wrapping
            if first is None or not np.array_equal(first, start) or np.any(first + (nvec - 1) < first):
                raise CodecError(f"{path}: MultiDiscrete start must be integers, with start + nvec - 1 in {nvec.dtype}")
            return gym.spaces.MultiDiscrete(nvec, dtype=nvec.dtype, start=start)
        if kind == "multi_binary":
            shape = tuple(msg.multi_binary.shape)
            if not shape or any(d <= 0 for d in shape):
                raise CodecError(f"{path}: MultiBinary needs a positive shape, got {shape}")
            return gym.spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
        if kind == "dict":
            items = [(e.key, space_from_proto(e.space, f'{path}["{e.key}"]', budget)) for e in msg.dict.entries]
            if len({k for k, _ in items}) != len(items):
                raise CodecError(f"{path}: Dict has duplicate keys")
            return gym.spaces.Dict(items)
        if kind == "tuple":
            return gym.spaces.Tuple(
                [space_from_proto(s, f"{path}[{i}]", budget) for i, s in enumerate(msg.tuple.spaces)]
            )
    except CodecError:
        raise
    except (ValueError, TypeError, AssertionError) as exc:  # gymnasium's own checks
        raise CodecError(f"{path}: {exc}") from exc
    raise CodecError(f"{path}: missing space")


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A space as plain JSON data (the Space message's JSON form), for files a person can read."""
    return json_format.MessageToDict(space_to_proto(space))


def space_from_json(data: dict[str, Any], path: str = "space") -> gym.Space:
    """The space `space_to_json` wrote; CodecError naming `path` for anything else."""
    try:
        message = json_format.ParseDict(data, pb.Space())
    except json_format.ParseError as exc:
        raise CodecError(f"{path}: not a space: {exc}") from exc
    return space_from_proto(message, path)
