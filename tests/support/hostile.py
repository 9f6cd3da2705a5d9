"""Hypothesis strategies for hostile Connect streams, written from the wire contract (proto/README.md) alone.

A stream is the bytes of its messages: mostly a hello and steps that are nearly right (the right shapes, or one
column off: another dtype, NaN or an infinity, bool bytes other than 0 and 1, a huge or negative shape, a value
of another nesting), and now and then what no client should send (a second hello, a step after a close, an
empty message, bytes that are no message). Multi-agent streams add agent ids of every kind (unknown, repeated
in a hello, empty, '__all__', odd characters), agents missing, '__all__' missing, rewards that are not finite
as float32, and another number of sub-env steps than the hello's `num_envs`. (support/mutator.py, beside,
mutates valid streams' bytes with a seeded random generator.)

`hostile_batches` does the same for what a hostile or broken server sends its learner: a valid EpisodeBatch with
a column, a count, an id or a model output changed.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from google.protobuf import struct_pb2
from hypothesis import strategies as st

from rlgate.core import codec
from rlgate.v1 import episode_pb2, learner_pb2, tensor_pb2
from rlgate.v1 import policy_pb2 as pb

# Wire dtype codes, valid and not (a proto3 enum field takes any int32).
DTYPE_CODES = st.sampled_from([*range(13), 13, 99, -1, 2**31 - 1])
# Dimensions that trip size arithmetic: empty, negative, past int32 / int64 / numpy's limits.
DIMS = st.integers(0, 4) | st.sampled_from([-1, -(2**63), 2**31, 2**62, 2**63 - 1])
NUMPY_DTYPES = [np.dtype(d) for d in ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8")]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 3.5e38, 65504.0, -0.0, 5e-324]
# Ids and keys: plain, reserved, empty, control characters, a "." (torch refuses it in a submodule name), long.
ODD_TEXT = st.sampled_from(["", "__all__", "a.b", "keys", "\x00", "x\ny", "\u202e", "é" * 3, "x" * 300]) | st.text(
    max_size=8
)


@st.composite
def array_tensors(draw: st.DrawFn, shape: tuple[int, ...]) -> tensor_pb2.Tensor:
    """A tensor of this shape in any dtype, its values ordinary or odd (NaN, infinities, huge, bool bytes 2..255)."""
    dtype = draw(st.sampled_from(NUMPY_DTYPES))
    size = math.prod(shape)
    if dtype.kind == "f":
        values = draw(st.lists(st.floats(-1, 1) | st.sampled_from(ODD_FLOATS), min_size=size, max_size=size))
        with np.errstate(over="ignore"):
            array = np.array(values, np.float64).astype(dtype)
    elif dtype.kind == "b":
        array = np.frombuffer(
            bytes(draw(st.lists(st.sampled_from([0, 1, 1, 2, 255]), min_size=size, max_size=size))), "?"
        )
    else:
        info = np.iinfo(dtype)
        values = draw(
            st.lists(st.integers(-1, 3) | st.sampled_from([int(info.min), int(info.max)]), min_size=size, max_size=size)
        )
        array = np.array([min(max(v, int(info.min)), int(info.max)) for v in values], dtype)
    tensor = codec.to_tensor(array.reshape(shape))
    if dtype.kind == "b":  # to_tensor reads bool bytes as True; the odd ones travel as they are
        tensor.data = array.tobytes()
    return tensor


@st.composite
def raw_tensors(draw: st.DrawFn) -> tensor_pb2.Tensor:
    """Any dtype code, any shape (up to 33 dimensions), any bytes: rarely consistent."""
    return tensor_pb2.Tensor(
        dtype=draw(DTYPE_CODES),
        shape=draw(st.lists(DIMS, max_size=3) | st.just([1] * 33)),
        data=draw(st.binary(max_size=32)),
    )


def tensors(shape: tuple[int, ...]) -> st.SearchStrategy[tensor_pb2.Tensor]:
    """Mostly of the right shape, else anything."""
    return array_tensors(shape) | array_tensors(shape) | raw_tensors()


def values(shape: tuple[int, ...]) -> st.SearchStrategy[tensor_pb2.Value]:
    """A Value: a tensor (mostly of `shape`), or dicts and tuples of them, nested a few levels, or nothing."""
    leaves = tensors(shape).map(lambda t: tensor_pb2.Value(tensor=t))
    return st.recursive(
        leaves | st.just(tensor_pb2.Value()),
        lambda inner: (
            st.dictionaries(ODD_TEXT, inner, max_size=3).map(
                lambda items: tensor_pb2.Value(dict=tensor_pb2.ValueDict(items=items))
            )
            | st.lists(inner, max_size=3).map(lambda items: tensor_pb2.Value(tuple=tensor_pb2.ValueTuple(items=items)))
        ),
        max_leaves=4,
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.sampled_from(ODD_FLOATS) | ODD_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=6,
)


def structs() -> st.SearchStrategy[struct_pb2.Struct]:
    """An info: any JSON-like values, NaN and infinities included (a Struct's numbers are doubles)."""

    def struct(fields: dict) -> struct_pb2.Struct:
        info = struct_pb2.Struct()
        info.update(fields)
        return info

    return st.dictionaries(ODD_TEXT, JSON, max_size=3).map(struct)


@st.composite
def odd_spaces(draw: st.DrawFn, depth: int = 0) -> tensor_pb2.Space:
    """A Space message of any kind, its parameters sometimes impossible (n <= 0, low > high, NaN bounds)."""
    kind = draw(st.sampled_from(["box", "discrete", "multi_discrete", "multi_binary", "dict", "tuple", "unset"]))
    if kind == "box":
        shape = draw(st.sampled_from([(4,), (3,), (), (2, 2)]))
        return tensor_pb2.Space(box=tensor_pb2.BoxSpace(low=draw(tensors(shape)), high=draw(tensors(shape))))
    if kind == "discrete":
        extreme = st.integers(-2, 3) | st.sampled_from([2**62, 2**63 - 1, -(2**63)])
        return tensor_pb2.Space(discrete=tensor_pb2.DiscreteSpace(n=draw(extreme), start=draw(extreme)))
    if kind == "multi_discrete":
        nvec, start = draw(tensors((2,))), draw(tensors((2,)))
        return tensor_pb2.Space(multi_discrete=tensor_pb2.MultiDiscreteSpace(nvec=nvec, start=start))
    if kind == "multi_binary":
        return tensor_pb2.Space(multi_binary=tensor_pb2.MultiBinarySpace(shape=draw(st.lists(DIMS, max_size=3))))
    if kind in ("dict", "tuple") and depth < 3:
        inner = st.lists(odd_spaces(depth + 1), max_size=2)
        if kind == "tuple":
            return tensor_pb2.Space(tuple=tensor_pb2.TupleSpace(spaces=draw(inner)))
        entries = [tensor_pb2.DictSpaceEntry(key=draw(ODD_TEXT), space=space) for space in draw(inner)]
        return tensor_pb2.Space(dict=tensor_pb2.DictSpace(entries=entries))
    return tensor_pb2.Space()


def inside(space: gym.spaces.Box, rows: int | None = None) -> st.SearchStrategy[np.ndarray]:
    """Observations of a flat float Box whose bounds hold [-0.375, 0.375] (CartPole's do): `rows` of them, or one."""
    shape = space.shape if rows is None else (rows, *space.shape)
    floats = st.floats(-0.375, 0.375, width=32)
    return st.lists(floats, min_size=math.prod(shape), max_size=math.prod(shape)).map(
        lambda values: np.array(values, space.dtype).reshape(shape)
    )


# --- whole streams -------------------------------------------------------------------------------------------

NUM_ENVS = st.sampled_from([1, 1, 2, 3])
ODD_NUM_ENVS = st.sampled_from([0, 1025, 2**32 - 1])
# What no client should send in the middle of a stream.
STRAYS = st.sampled_from(
    [
        pb.ClientMessage().SerializeToString(),  # sets none of hello, step, close
        b"\xff\xff\xff",  # no message at all
        pb.ClientMessage(close=pb.Close()).SerializeToString(),  # the stream ends: what follows is unread
    ]
)


@st.composite
def single_agent_streams(draw: st.DrawFn, observation_space: gym.Space, action_space: gym.Space) -> list[bytes]:
    """A hello (sometimes odd, or missing) and steps for the served spaces (a flat Box), some of them hostile."""
    n = draw(NUM_ENVS)
    shape = (n, *observation_space.shape)
    hello = pb.Hello(
        client_id="hostile",
        observation_space=codec.space_to_proto(observation_space),
        action_space=codec.space_to_proto(action_space),
        num_envs=n,
        explore=draw(st.booleans()),
    )
    odd = draw(st.sampled_from([None] * 5 + ["client_id", "num_envs", "module_id", "spaces"]))
    if odd == "client_id":
        hello.client_id = draw(ODD_TEXT)
    elif odd == "num_envs":
        hello.num_envs = draw(ODD_NUM_ENVS)
    elif odd == "module_id":
        hello.module_id = draw(ODD_TEXT)
    elif odd == "spaces":
        getattr(hello, draw(st.sampled_from(["observation_space", "action_space"]))).CopyFrom(draw(odd_spaces()))
    messages = [] if draw(st.integers(0, 9)) == 0 else [pb.ClientMessage(hello=hello).SerializeToString()]
    for _ in range(draw(st.integers(1, 5))):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            messages.append(draw(STRAYS | st.just(pb.ClientMessage(hello=hello).SerializeToString())))
            continue
        observations = draw(inside(observation_space, n))
        step = pb.Step(
            obs=codec.to_value(observations),
            reward=codec.to_tensor(np.zeros(n, np.float32)),
            terminated=codec.to_tensor(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))),
            truncated=codec.to_tensor(np.zeros(n, bool)),
        )
        if choice >= 5:  # one part hostile
            part = draw(
                st.sampled_from(["obs", "obs value", "reward", "terminated", "truncated", "drop", "infos", "agents"])
            )
            if part == "obs":
                step.obs.CopyFrom(tensor_pb2.Value(tensor=draw(tensors(shape))))
            elif part == "obs value":
                step.obs.CopyFrom(draw(values(shape)))
            elif part in ("reward", "terminated", "truncated"):
                getattr(step, part).CopyFrom(draw(tensors((n,))))
            elif part == "drop":
                step.ClearField(draw(st.sampled_from(["obs", "reward", "terminated", "truncated"])))
            elif part == "infos":
                step.infos.extend(draw(st.lists(structs(), min_size=n, max_size=n) | st.lists(structs(), max_size=4)))
            else:
                step.agents.append(pb.AgentsStep(obs={"agent_0": codec.to_value(observations[0])}))
        messages.append(pb.ClientMessage(step=step).SerializeToString())
    return messages


@st.composite
def multi_agent_streams(draw: st.DrawFn, agent_spaces: dict[str, tuple[gym.Space, gym.Space]]) -> list[bytes]:
    """A multi-agent hello (sometimes odd) and AgentsSteps for the served agents, some of them hostile."""
    n = draw(NUM_ENVS)
    known = list(agent_spaces)
    ids = st.sampled_from(known) | ODD_TEXT
    declared = draw(st.lists(st.sampled_from(known), min_size=1, max_size=len(known), unique=True))
    agents = [
        pb.AgentSpaces(
            agent_id=a,
            observation_space=codec.space_to_proto(agent_spaces[a][0]),
            action_space=codec.space_to_proto(agent_spaces[a][1]),
        )
        for a in declared
    ]
    odd = draw(st.sampled_from(["id", "repeated", "spaces", "none", "single-agent spaces too", "num_envs"]))
    if draw(st.integers(0, 3)):  # mostly a right hello
        odd = None
    if odd == "id":
        agents.append(
            pb.AgentSpaces(
                agent_id=draw(ODD_TEXT),
                observation_space=agents[0].observation_space,
                action_space=agents[0].action_space,
            )
        )
    elif odd == "repeated":
        agents.append(agents[0])
    elif odd == "spaces":
        agents[0] = pb.AgentSpaces(
            agent_id=agents[0].agent_id, observation_space=draw(odd_spaces()), action_space=draw(odd_spaces())
        )
    elif odd == "none":
        agents = []
    elif odd == "num_envs":
        n = draw(ODD_NUM_ENVS)
    hello = pb.Hello(client_id="hostile", num_envs=n, explore=draw(st.booleans()), agents=agents)
    if odd == "single-agent spaces too":
        hello.observation_space.CopyFrom(agents[0].observation_space)
    messages = [pb.ClientMessage(hello=hello).SerializeToString()]
    rows = min(n, 3)
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.integers(0, 9)) == 0:
            messages.append(draw(STRAYS | st.just(messages[0])))
            continue
        step = pb.Step()
        for _ in range(rows if draw(st.integers(0, 19)) else draw(st.sampled_from([0, rows - 1, rows + 1]))):
            step.agents.append(draw(agents_steps(agent_spaces, declared, ids)))
        messages.append(pb.ClientMessage(step=step).SerializeToString())
    return messages


@st.composite
def agents_steps(
    draw: st.DrawFn, agent_spaces: dict[str, tuple[gym.Space, gym.Space]], declared: list[str], ids: st.SearchStrategy
) -> pb.AgentsStep:
    """One sub-env's step: mostly every declared agent observing and rewarded, '__all__' false; now and then an
    agent missing or unknown, an observation or reward off or missing, a flag set, '__all__' missing, odd infos."""
    acting = draw(st.lists(st.sampled_from(declared), max_size=len(declared), unique=True) | st.just(declared))
    step = pb.AgentsStep(
        obs={a: codec.to_value(draw(inside(agent_spaces[a][0]))) for a in acting},
        rewards=dict.fromkeys(declared, 1.0),
        terminateds={"__all__": draw(st.integers(0, 9)) == 0},
        truncateds={"__all__": False},
    )
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        part = draw(
            st.sampled_from(["obs", "obs value", "reward", "no reward", "flag", "no __all__", "infos", "missing"])
        )
        agent = draw(ids)
        if part == "obs":
            step.obs[agent].CopyFrom(tensor_pb2.Value(tensor=draw(tensors((4,)))))
        elif part == "obs value":
            step.obs[agent].CopyFrom(draw(values((4,))))
        elif part == "reward":
            step.rewards[agent] = draw(st.floats() | st.sampled_from(ODD_FLOATS))
        elif part == "no reward":
            step.rewards.pop(agent, None)
        elif part == "flag":
            getattr(step, draw(st.sampled_from(["terminateds", "truncateds"])))[agent] = draw(st.booleans())
        elif part == "no __all__":
            getattr(step, draw(st.sampled_from(["terminateds", "truncateds"]))).pop("__all__", None)
        elif part == "infos":
            step.infos[agent].CopyFrom(draw(structs()))
        elif agent in step.obs:
            del step.obs[agent]
    return step


# --- episode batches: a hostile (or broken) server to its learner ----------------------------------------------


def _tensors_of(value: tensor_pb2.Value) -> list[tensor_pb2.Tensor]:
    kind = value.WhichOneof("kind")
    if kind == "tensor":
        return [value.tensor]
    if kind == "dict":
        return [t for item in value.dict.items.values() for t in _tensors_of(item)]
    return [t for item in value.tuple.items for t in _tensors_of(item)] if kind == "tuple" else []


# Per-chunk fields of a table, and odd values for each.
_PER_CHUNK = {
    "chunk_indices": st.integers(0, 3) | st.just(2**32 - 1),
    "len_lookback_buffers": st.integers(0, 3) | st.just(2**32 - 1),
    "steps": st.integers(0, 20) | st.just(2**32 - 1),
    "terminated": st.booleans(),
    "truncated": st.booleans(),
    "t_started": st.integers(-2, 3) | st.sampled_from([-(2**63), 2**63 - 1]),
    "multi_agent_env_steps": st.integers(0, 3) | st.just(2**32 - 1),
    "agent_ids": ODD_TEXT,
    "multi_agent_episode_ids": ODD_TEXT,
}


@st.composite
def hostile_batches(draw: st.DrawFn, base: learner_pb2.EpisodeBatch) -> learner_pb2.EpisodeBatch:
    """`base` (one table of chunks) with one to three parts changed: a column's dtype, shape or values (NaN,
    infinities, huge), a chunk's counts, ids or flags, model outputs dropped or added, infos, the batch's
    observation space, its module id, its connector state, an old-style chunk message of anything."""
    batch = learner_pb2.EpisodeBatch()
    batch.CopyFrom(base)
    table = batch.chunks[0]
    for _ in range(draw(st.integers(1, 3))):
        part = draw(
            st.sampled_from(
                [
                    "column",
                    "column",
                    "per chunk",
                    "outputs",
                    "infos",
                    "space",
                    "ids",
                    "module",
                    "connector state",
                    "episode",
                    "twice",
                ]
            )
        )
        if part == "column":
            columns = [table.rewards, table.model_versions, *_tensors_of(table.observations)]
            columns += [
                *_tensors_of(table.actions),
                *(t for v in table.extra_model_outputs.values() for t in _tensors_of(v)),
            ]
            column = draw(st.sampled_from(columns))
            shape = tuple(column.shape) if all(0 <= d <= 1 << 8 for d in column.shape) else (1,)  # once odd
            column.CopyFrom(draw(tensors(shape)))
        elif part == "per chunk":
            name = draw(st.sampled_from(sorted(_PER_CHUNK)))
            entries = getattr(table, name)
            if entries and draw(st.booleans()):
                entries[draw(st.integers(0, len(entries) - 1))] = draw(_PER_CHUNK[name])
            else:
                entries.append(draw(_PER_CHUNK[name]))
        elif part == "outputs":
            if table.extra_model_outputs and draw(st.booleans()):
                del table.extra_model_outputs[draw(st.sampled_from(sorted(table.extra_model_outputs)))]
            else:
                table.extra_model_outputs[draw(ODD_TEXT)].CopyFrom(draw(values(tuple(table.rewards.shape))))
        elif part == "infos":
            first = base.chunks[0]
            rows = sum(first.steps) + sum(first.len_lookback_buffers) + len(first.ids)  # an info per observation
            table.infos.extend(
                draw(st.lists(structs(), min_size=rows, max_size=rows) | st.lists(structs(), max_size=3))
            )
        elif part == "space":
            batch.observation_space.CopyFrom(draw(odd_spaces()))
        elif part == "ids":
            table.ids[draw(st.integers(0, len(table.ids) - 1))] = draw(ODD_TEXT | st.sampled_from(list(table.ids)))
        elif part == "module":
            table.module_id = draw(ODD_TEXT)
        elif part == "connector state":
            batch.connector_state.CopyFrom(draw(values(())))
        elif part == "episode":
            batch.episodes.append(
                episode_pb2.Episode(
                    id=draw(ODD_TEXT),
                    observations=draw(values((2, 4))),
                    actions=draw(values((1,))),
                    rewards=draw(tensors((1,))),
                    len_lookback_buffer=draw(st.integers(0, 2)),
                )
            )
        else:
            batch.chunks.append(table)
    return batch
