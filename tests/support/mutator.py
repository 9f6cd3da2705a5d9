"""Seeded mutations of valid Connect streams, for fuzzing a server: `Mutator(seed, ...).case(i)` is reproducible.

A case is the bytes of one stream: a valid opening (nothing, a hello, a hello and some steps), one
mutated message (byte flips, truncation, insertion, random bytes, or a field-level change to a hello
or a step: tensor dtype/shape/data, huge shapes, wrong num_envs, other spaces, odd nesting, infos,
messages out of order), and a valid step after it, in case the server accepted the mutant. The server
must answer each message or end the stream with a client-error status; never INTERNAL, never a crash.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal

import gymnasium as gym
import numpy as np

from rlgate.core import codec
from rlgate.v1 import policy_pb2 as pb
from rlgate.v1 import tensor_pb2
from support.servers import hello, step

# Dimensions that trip size arithmetic: empty, negative, past int32 / int64 / numpy's limits.
ODD_DIMS = (0, 1, 2, 3, 4, 5, -1, -(2**63), 2**31, 2**32, 2**62, 2**63 - 1, 1 << 40)
# Wire dtype codes, valid and not (proto3 enums accept any int32).
DTYPE_CODES = (*range(0, 14), 99, -1, 2**31 - 1)


class Messages:
    """Valid messages of one stream: its hello, and steps of random observations in the spaces."""

    def __init__(
        self, rng: random.Random, observation_space: gym.Space, action_space: gym.Space, n: int, batched: dict
    ) -> None:
        """`batched`: n -> the observation space batched for n rows, filled as needed and shared between cases
        (gymnasium's batch_space costs more than a whole step)."""
        self.rng, self.observation_space, self.action_space, self.n = rng, observation_space, action_space, n
        self._batched = batched

    def hello(self) -> pb.ClientMessage:
        return hello(self.observation_space, self.action_space, num_envs=self.n)

    def step(self, *, first: bool = False, n: int | None = None) -> pb.ClientMessage:
        """A step of `n` rows (the stream's num_envs by default); the first after hello has zero rewards."""
        n = self.n if n is None else n
        if n:
            rows = self._batched.get(n) or self._batched.setdefault(
                n, gym.vector.utils.batch_space(self.observation_space, n)
            )
            rows.seed(self.rng.randrange(1 << 31))
            obs = rows.sample()
        else:
            obs = np.zeros((0, 4), np.float32)
        terminated = np.array([self.rng.random() < 0.2 for _ in range(n)], bool)
        reward = np.array([0.0 if first else self.rng.uniform(-10, 10) for _ in range(n)])
        return step(obs, n, reward=reward, terminated=terminated)


class Mutator:
    """Cases for one seed and served spaces; `case(i)` depends only on them and i, so a failing case replays alone."""

    def __init__(self, seed: int, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.seed = seed
        self.observation_space, self.action_space = observation_space, action_space
        self._batched: dict[int, gym.Space] = {}

    def case(self, index: int) -> tuple[str, list[bytes], int]:
        """(what was mutated, the stream's messages as bytes, the mutant's position among them)."""
        rng = random.Random(f"{self.seed}:{index}")
        name, base, mutate = rng.choice(MUTATIONS)
        if base == "any":
            base = rng.choice(("hello", "step", "step"))
        valid = Messages(rng, self.observation_space, self.action_space, rng.choice((1, 1, 2, 3)), self._batched)
        if base == "hello":  # mostly the first message; sometimes a second hello
            opening = [] if rng.random() < 0.9 else [valid.hello()]
        else:  # mostly after a hello and some steps; sometimes a step before hello
            opening = [] if rng.random() < 0.1 else [valid.hello()]
            opening += [valid.step(first=i == 0) for i in range(len(opening) and rng.choice((0, 0, 1, 2)))]
        mutant = mutate(rng, valid.hello() if base == "hello" else valid.step(first=len(opening) <= 1), valid)
        messages = [m.SerializeToString() for m in opening]
        return name, [*messages, mutant, valid.step(first=base == "hello").SerializeToString()], len(messages)


# --- byte-level ---------------------------------------------------------------------------------------


def byte_flips(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    data = bytearray(base.SerializeToString())
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    return bytes(data)


def truncation(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    data = base.SerializeToString()
    return data[: rng.randrange(len(data))]


def insertion(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    data = bytearray(base.SerializeToString())
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def random_bytes(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 2, 5, 20, 200, 2000)))


def concatenation(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    """Two messages' bytes as one: protobuf merges them (e.g. a hello and a step in one oneof)."""
    return base.SerializeToString() + rng.choice((valid.hello(), valid.step(), base)).SerializeToString()


# --- field-level ----------------------------------------------------------------------------------------


def _mutate_tensor(rng: random.Random, tensor: tensor_pb2.Tensor) -> None:
    what = rng.choice(("dtype", "shape", "data", "shape+data", "huge", "non-finite", "clear"))
    if what == "dtype":
        tensor.dtype = rng.choice(DTYPE_CODES)
    elif what in ("shape", "shape+data"):
        tensor.ClearField("shape")
        tensor.shape.extend(rng.choice(ODD_DIMS) for _ in range(rng.choice((0, 1, 2, 3, 33))))
        if what == "shape+data":
            tensor.data = rng.randbytes(min(rng.choice((0, 1, 4, 16, 64)), 1 << 16))
    elif what == "data":
        tensor.data = rng.choice((b"", tensor.data[:-1], tensor.data + b"\0", rng.randbytes(len(tensor.data))))
    elif what == "huge":
        tensor.ClearField("shape")
        tensor.shape.extend(rng.choice(([0, 2**62], [2**62, 2**62], [2**31, 2**31], [2**63 - 1], [1 << 40, 0])))
    elif what == "non-finite":
        dtype = rng.choice((np.float16, np.float32, np.float64))
        tensor.dtype = {np.float16: tensor_pb2.DTYPE_FLOAT16, np.float32: tensor_pb2.DTYPE_FLOAT32}.get(
            dtype, tensor_pb2.DTYPE_FLOAT64
        )
        special = rng.choice((np.nan, np.inf, -np.inf, 1e300, -1e300))
        with np.errstate(over="ignore"):
            tensor.data = np.full(math.prod(tensor.shape), special).astype(dtype).tobytes()
    else:
        tensor.Clear()


def _tensors_of_value(value: tensor_pb2.Value) -> list[tensor_pb2.Tensor]:
    kind = value.WhichOneof("kind")
    if kind == "tensor":
        return [value.tensor]
    if kind == "dict":
        return [t for v in value.dict.items.values() for t in _tensors_of_value(v)]
    if kind == "tuple":
        return [t for v in value.tuple.items for t in _tensors_of_value(v)]
    return []


def step_tensor(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    """One of a step's tensors (an obs leaf, reward, terminated, truncated) changed in dtype, shape or data."""
    s = base.step
    _mutate_tensor(rng, rng.choice([*_tensors_of_value(s.obs), s.reward, s.terminated, s.truncated]))
    return base.SerializeToString()


def step_fields(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    """A step with fields left out, rows for another num_envs, odd nesting, infos or values out of bounds."""
    s = base.step
    what = rng.choice(("drop", "num_envs", "nest", "infos", "out of bounds"))
    if what == "drop":
        for name in rng.sample(("obs", "reward", "terminated", "truncated"), rng.randint(1, 4)):
            s.ClearField(name)
    elif what == "num_envs":
        s.CopyFrom(valid.step(n=rng.choice((0, valid.n + 1, valid.n - 1 or 2, 1000))).step)
    elif what == "nest":
        s.obs.CopyFrom(_nest(rng, s.obs, rng.randint(1, 30)))
    elif what == "infos":
        for _ in range(rng.choice((1, valid.n, valid.n + 1, 50))):
            info = s.infos.add()
            info.update({rng.choice(("a", "", "é", "x" * 1000)): rng.choice((1.0, "s", None, True, [1, {"k": []}]))})
    else:
        tensor = rng.choice(_tensors_of_value(s.obs))
        values = codec.from_tensor(tensor)
        info = (
            np.finfo(values.dtype)
            if values.dtype.kind == "f"
            else np.iinfo(np.uint8 if values.dtype == bool else values.dtype)
        )
        extreme = rng.choice((info.max, info.min, 2))
        tensor.data = np.full(values.shape, extreme, np.uint8 if values.dtype == bool else values.dtype).tobytes()
    return base.SerializeToString()


def _nest(rng: random.Random, value: tensor_pb2.Value, depth: int) -> tensor_pb2.Value:
    for _ in range(depth):
        if rng.random() < 0.5:
            value = tensor_pb2.Value(tuple=tensor_pb2.ValueTuple(items=[value] * rng.randint(0, 2)))
        else:
            value = tensor_pb2.Value(dict=tensor_pb2.ValueDict(items={rng.choice(("a", "", "obs")): value}))
    return value


def _odd_space(rng: random.Random, depth: int = 0) -> tensor_pb2.Space:
    """A space message of any kind with odd parameters (and, sometimes, nested)."""
    kind = rng.choice(("box", "discrete", "multi_discrete", "multi_binary", "dict", "tuple", "empty"))
    space = tensor_pb2.Space()
    if kind == "box":
        low, high = np.full(4, -1.0, np.float32), np.full(4, 1.0, np.float32)
        dtype = rng.choice((np.float16, np.float32, np.float64, np.int8, np.uint8, np.int64, np.bool_))
        with np.errstate(invalid="ignore"):  # NaN and inf cast to integers: whatever numpy makes of them
            space.box.low.CopyFrom(codec.to_tensor(rng.choice((low, high, np.full(4, np.nan))).astype(dtype)))
            space.box.high.CopyFrom(codec.to_tensor(rng.choice((high, low, np.full(4, np.inf))).astype(dtype)))
        if rng.random() < 0.5:
            _mutate_tensor(rng, rng.choice((space.box.low, space.box.high)))
    elif kind == "discrete":
        space.discrete.n = rng.choice((-1, 0, 1, 2, 2**31, 2**63 - 1))
        space.discrete.start = rng.choice((0, -1, 2**62, -(2**63), 2**63 - 1))
    elif kind == "multi_discrete":
        nvec = np.array(rng.choice(([2, 3], [0], [-1], [2**62], [])), np.int64)
        space.multi_discrete.nvec.CopyFrom(codec.to_tensor(nvec.astype(rng.choice((np.int64, np.uint8, np.float32)))))
        start = np.array(rng.choice(([0, 0], [0], [2**62, -1], [])), np.int64)
        space.multi_discrete.start.CopyFrom(codec.to_tensor(start))
    elif kind == "multi_binary":
        space.multi_binary.shape.extend(rng.choice(ODD_DIMS) for _ in range(rng.choice((0, 1, 2, 33))))
    elif kind == "dict" and depth < 20:
        for _ in range(rng.choice((0, 1, 2))):
            space.dict.entries.add(key=rng.choice(("a", "a", "", "obs")), space=_odd_space(rng, depth + 1))
    elif kind == "tuple" and depth < 20:
        space.tuple.spaces.extend(_odd_space(rng, depth + 1) for _ in range(rng.choice((0, 1, 2))))
    return space


def hello_fields(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    """A hello with odd num_envs, module or client ids, or other spaces."""
    h = base.hello
    what = rng.choice(("num_envs", "ids", "observation_space", "action_space", "space tensor", "drop"))
    if what == "num_envs":
        h.num_envs = rng.choice((0, 1023, 1024, 1025, 2**31, 2**32 - 1))
    elif what == "ids":
        h.module_id = rng.choice(("", "default", "nope", "\x00", "é" * 100))
        h.client_id = rng.choice(("", "\x00", "x" * 100_000, "\U0001f600"))
    elif what in ("observation_space", "action_space"):
        getattr(h, what).CopyFrom(_odd_space(rng))
    elif what == "space tensor":
        tensors = [t for space in (h.observation_space, h.action_space) for t in _tensors_of_space(space)]
        if tensors:
            _mutate_tensor(rng, rng.choice(tensors))
    else:
        h.ClearField(rng.choice(("observation_space", "action_space")))
    return base.SerializeToString()


def _tensors_of_space(space: tensor_pb2.Space) -> list[tensor_pb2.Tensor]:
    kind = space.WhichOneof("kind")
    if kind == "box":
        return [space.box.low, space.box.high]
    if kind == "multi_discrete":
        return [space.multi_discrete.nvec, space.multi_discrete.start]
    if kind == "dict":
        return [t for e in space.dict.entries for t in _tensors_of_space(e.space)]
    if kind == "tuple":
        return [t for s in space.tuple.spaces for t in _tensors_of_space(s)]
    return []


def out_of_order(rng: random.Random, base: pb.ClientMessage, valid: Messages) -> bytes:
    """A valid message at the wrong time: a second hello, an empty message, a close (and a step after it)."""
    return rng.choice((valid.hello(), pb.ClientMessage(), pb.ClientMessage(close=pb.Close()))).SerializeToString()


Mutation = Callable[[random.Random, pb.ClientMessage, Messages], bytes]
# (name, the valid message it starts from: "hello", "step" or "any", the mutation), drawn uniformly.
MUTATIONS: tuple[tuple[str, Literal["hello", "step", "any"], Mutation], ...] = (
    ("byte_flips", "any", byte_flips),
    ("truncation", "any", truncation),
    ("insertion", "any", insertion),
    ("random_bytes", "any", random_bytes),
    ("concatenation", "any", concatenation),
    ("step_tensor", "step", step_tensor),
    ("step_tensor", "step", step_tensor),
    ("step_fields", "step", step_fields),
    ("hello_fields", "hello", hello_fields),
    ("hello_fields", "hello", hello_fields),
    ("out_of_order", "any", out_of_order),
)
