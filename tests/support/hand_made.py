"""Messages made by hand from the proto alone, as a client author in another language writes them: tensors from
the DType enum and little-endian bytes, CartPole's spaces as its documentation gives them, the bearer token."""

from __future__ import annotations

import numpy as np

from rlgate.v1 import tensor_pb2

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
# The DType enum as a client writes it down: wire code <-> little-endian numpy dtype.
DTYPES = {
    tensor_pb2.DTYPE_BOOL: "|b1",
    tensor_pb2.DTYPE_INT32: "<i4",
    tensor_pb2.DTYPE_INT64: "<i8",
    tensor_pb2.DTYPE_FLOAT32: "<f4",
    tensor_pb2.DTYPE_FLOAT64: "<f8",
}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def tensor(array: np.ndarray) -> tensor_pb2.Tensor:
    array = np.ascontiguousarray(array)
    return tensor_pb2.Tensor(dtype=CODES[array.dtype.newbyteorder("<")], shape=array.shape, data=array.tobytes())


def array(message: tensor_pb2.Tensor) -> np.ndarray:
    return np.frombuffer(message.data, DTYPES[message.dtype]).reshape(tuple(message.shape))


def box(low: np.ndarray, high: np.ndarray) -> tensor_pb2.Space:
    return tensor_pb2.Space(box=tensor_pb2.BoxSpace(low=tensor(low), high=tensor(high)))


# CartPole-v1's spaces, as its documentation gives them: Box(float32, 4) with infinite velocity bounds, Discrete(2).
HIGH = np.array([4.8, np.inf, 0.41887903, np.inf], "<f4")
CARTPOLE_OBS = box(-HIGH, HIGH)
CARTPOLE_ACTIONS = tensor_pb2.Space(discrete=tensor_pb2.DiscreteSpace(n=2))
