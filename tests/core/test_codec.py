"""The wire codec: property-based round trips for every space type, and a corpus of malformed input."""

import contextlib

import gymnasium as gym
import numpy as np
import pytest
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlgate.core import codec
from rlgate.core.codec import CodecError
from rlgate.core.space_check import SpaceCheck
from rlgate.v1 import tensor_pb2 as pb

WIRE_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


# --- strategies -------------------------------------------------------------------------------------


def leaf_spaces() -> st.SearchStrategy[gym.Space]:
    shapes = hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)
    box = st.builds(
        lambda shape, dtype, bound: gym.spaces.Box(-bound, bound, shape=shape, dtype=dtype),
        shapes,
        st.sampled_from([np.float32, np.float64, np.int32]),
        st.integers(1, 100),
    )
    image = st.builds(lambda shape: gym.spaces.Box(0, 255, shape=shape, dtype=np.uint8), shapes)
    discrete = st.builds(lambda n, start: gym.spaces.Discrete(n, start=start), st.integers(1, 50), st.integers(-5, 5))
    multi_discrete = st.builds(
        lambda nvec: gym.spaces.MultiDiscrete(nvec), st.lists(st.integers(1, 9), min_size=1, max_size=4)
    )
    multi_binary = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(
        lambda s: gym.spaces.MultiBinary(s[0] if len(s) == 1 else s)
    )
    return st.one_of(box, image, discrete, multi_discrete, multi_binary)


def nested_spaces() -> st.SearchStrategy[gym.Space]:
    return st.recursive(
        leaf_spaces(),
        lambda children: st.one_of(
            st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), children, min_size=1, max_size=3).map(
                lambda d: gym.spaces.Dict(list(d.items()))
            ),
            st.lists(children, min_size=1, max_size=3).map(gym.spaces.Tuple),
        ),
        max_leaves=5,
    )


def batch_of(space: gym.Space, n: int, seed: int):
    """n samples of `space` stacked along a leading axis."""
    space.seed(seed)
    samples = [space.sample() for _ in range(n)]
    return gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, n))


def assert_nested_equal(a, b) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_nested_equal(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_nested_equal(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


# --- tensors ----------------------------------------------------------------------------------------


@given(
    hnp.arrays(
        st.sampled_from(WIRE_DTYPES).map(np.dtype),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_tensor_round_trip_is_exact(array):
    decoded = codec.from_tensor(pb.Tensor.FromString(codec.to_tensor(array).SerializeToString()))
    assert decoded.dtype == array.dtype.newbyteorder("<") and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_tensor_decodes_without_copying():
    msg = codec.to_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    decoded = codec.from_tensor(msg)
    assert not decoded.flags.writeable and not decoded.flags.owndata
    assert decoded.base is not None


def test_big_endian_and_non_contiguous_input_encode_as_little_endian_c_order():
    array = np.arange(6, dtype=">i4").reshape(2, 3).T
    msg = codec.to_tensor(array)
    assert msg.data == np.ascontiguousarray(array, dtype="<i4").tobytes()
    np.testing.assert_array_equal(codec.from_tensor(msg), array)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2], data=b"\0" * 7), "7 data bytes != 8 for shape (2,)"),
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[2], data=b"\0" * 9), "9 data bytes != 8"),
        (pb.Tensor(dtype=pb.DTYPE_UNSPECIFIED, shape=[1], data=b"\0"), "missing (dtype not set)"),
        (pb.Tensor(dtype=99, shape=[1], data=b"\0"), "unknown dtype 99"),
        (pb.Tensor(dtype=pb.DTYPE_INT8, shape=[-1], data=b""), "negative dimension"),
        (pb.Tensor(dtype=pb.DTYPE_INT8, shape=[-2, -3], data=b"\0" * 6), "negative dimension"),  # product 6 > 0
        (pb.Tensor(dtype=pb.DTYPE_INT8, shape=[1 << 20, 1 << 20], data=b""), "more than"),
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[0, 2**62], data=b""), "more than"),  # numpy: "array is too big"
        (pb.Tensor(dtype=pb.DTYPE_INT8, shape=[1] * 33, data=b"\0"), "33 dimensions"),
        (pb.Tensor(dtype=pb.DTYPE_BOOL, shape=[3], data=b"\1\0\2"), "bool byte 2 at byte 2: a bool is one byte"),
    ],
)
def test_malformed_tensors_are_rejected_with_a_reason(tensor, message):
    with pytest.raises(CodecError, match="^obs: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        codec.from_tensor(tensor, "obs")


def test_unencodable_dtypes_are_rejected():
    with pytest.raises(CodecError, match="no wire encoding"):
        codec.to_tensor(np.array(["a"]))
    with pytest.raises(CodecError, match="no wire encoding"):
        codec.to_tensor(np.array([1 + 2j]))


# --- spaces and values ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_spaces(), st.integers(1, 4), st.integers(0, 2**16))
def test_space_and_value_round_trip_and_validate(space, n, seed):
    decoded_space = codec.space_from_proto(pb.Space.FromString(codec.space_to_proto(space).SerializeToString()))
    assert decoded_space == space
    if isinstance(space, gym.spaces.Dict):
        assert list(decoded_space.spaces) == list(space.spaces)  # key order survives

    value = batch_of(space, n, seed)
    wire = pb.Value.FromString(codec.to_value(value).SerializeToString())
    assert_nested_equal(codec.from_value(wire), value)
    assert_nested_equal(SpaceCheck(decoded_space).decode(wire, n), value)


def test_empty_containers_stay_containers():
    """An empty dict or tuple is still a dict or tuple on the wire (an unset Value would be "missing")."""
    for empty in ({}, (), {"a": {}, "b": ()}):
        wire = pb.Value.FromString(codec.to_value(empty).SerializeToString())
        assert codec.from_value(wire) == empty


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, shape=(3,)),
        gym.spaces.Box(np.array([-np.inf, 0]), np.array([np.inf, 1]), dtype=np.float64),
        gym.spaces.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8),
        gym.spaces.Box(np.zeros((2, 3), bool), np.ones((2, 3), bool), dtype=np.bool_),  # Go's board planes
        gym.spaces.Discrete(7, start=-3),
        gym.spaces.Discrete(2, start=2**63 - 2),  # its last value is int64's largest
        gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.MultiBinary([2, 3]),
        gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "id": gym.spaces.Discrete(3)}),
        gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Tuple([gym.spaces.MultiBinary(3)])]),
    ],
)
def test_every_space_type_round_trips(space):
    assert codec.space_from_proto(codec.space_to_proto(space)) == space


def test_infos_round_trip_through_struct_with_numpy_values():
    info = {"lives": np.int64(3), "pos": np.array([1.5, 2.0]), "nested": {"ok": True, "name": "x"}}
    assert codec.from_struct(codec.to_struct(info)) == {
        "lives": 3.0,
        "pos": [1.5, 2.0],
        "nested": {"ok": True, "name": "x"},
    }


def test_infos_keep_nan_and_infinities_through_the_wire():
    """json_format refuses NaN and +-inf, legal doubles in a Struct and what an env's info may hold (was INTERNAL)."""
    info = {"x": np.float32("nan"), "l": [np.inf, -np.inf, None], "nested": {"y": float("nan")}}
    back = codec.from_struct(struct_pb2.Struct.FromString(codec.to_struct(info).SerializeToString()))
    assert back["l"] == [np.inf, -np.inf, None]
    assert np.isnan(back["x"]) and np.isnan(back["nested"]["y"]) and set(back) == set(info)


# --- malformed corpus: every entry is rejected, and the message says where and what ---------------

MALFORMED_SPACES = [
    (pb.Space(), "missing space"),
    (pb.Space(discrete=pb.DiscreteSpace(n=0)), "Discrete needs n > 0"),
    (pb.Space(discrete=pb.DiscreteSpace(n=3, start=2**63 - 2)), r"^space: Discrete needs start \+ n - 1 in int64$"),
    (
        pb.Space(
            box=pb.BoxSpace(low=codec.to_tensor(np.zeros(2, np.float32)), high=codec.to_tensor(np.zeros(3, np.float32)))
        ),
        "low float32.*differ",
    ),
    (
        pb.Space(
            box=pb.BoxSpace(low=codec.to_tensor(np.ones(2, np.float32)), high=codec.to_tensor(np.zeros(2, np.float32)))
        ),
        "low <= high",
    ),
    (
        pb.Space(
            multi_discrete=pb.MultiDiscreteSpace(
                nvec=codec.to_tensor(np.array([0, 2])), start=codec.to_tensor(np.array([0, 0]))
            )
        ),
        "positive integer",
    ),
    # A start gymnasium would wrap or truncate into nvec's dtype (-1 -> 255, 0.5 -> 0, 255 + 2 -> 1).
    *(
        (
            pb.Space(
                multi_discrete=pb.MultiDiscreteSpace(
                    nvec=codec.to_tensor(np.array([2, 3], np.uint8)), start=codec.to_tensor(np.array(start, dtype))
                )
            ),
            r"^space: MultiDiscrete start must be integers, with start \+ nvec - 1 in uint8$",
        )
        for start, dtype in (
            ([-1, 0], np.int64),
            ([0.5, 0], np.float32),
            ([np.nan, 0], np.float32),
            ([0, 254], np.uint8),
        )
    ),
    (pb.Space(multi_binary=pb.MultiBinarySpace(shape=[])), "MultiBinary needs a positive shape"),
    (
        pb.Space(dict=pb.DictSpace(entries=[pb.DictSpaceEntry(key="a", space=pb.Space())])),
        r'space\["a"\]: missing',
    ),
    (
        pb.Space(tuple=pb.TupleSpace(spaces=[pb.Space(discrete=pb.DiscreteSpace(n=-2))])),
        r"space\[0\]: Discrete",
    ),
]


@pytest.mark.parametrize(("msg", "message"), MALFORMED_SPACES)
def test_malformed_spaces_are_rejected(msg, message):
    with pytest.raises(CodecError, match=message):
        codec.space_from_proto(msg)


def test_a_budget_of_spaces_holds_for_all_the_spaces_of_a_message():
    """A million Discretes in a Tuple are refused at the budget's end, having built no more than it allows."""
    two = pb.Space(discrete=pb.DiscreteSpace(n=2))
    huge = pb.Space(tuple=pb.TupleSpace(spaces=[two] * 1_000_000))
    with pytest.raises(
        CodecError, match=rf"^space\[{codec.MAX_SPACES - 1}\]: the message holds more than {codec.MAX_SPACES} "
    ):
        codec.space_from_proto(huge)
    nested = pb.Space(
        dict=pb.DictSpace(entries=[pb.DictSpaceEntry(key="a", space=pb.Space(tuple=pb.TupleSpace(spaces=[two, two])))])
    )
    budget = codec.SpaceBudget(7)  # two messages of 4 spaces each: the second runs out at its last one
    assert codec.space_from_proto(nested, "first", budget) == gym.spaces.Dict(
        {"a": gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2)}
    )
    with pytest.raises(CodecError, match=r'^second\["a"\]\[1\]: the message holds more than 7 spaces'):
        codec.space_from_proto(nested, "second", budget)


def test_missing_value_is_rejected_with_its_path():
    value = pb.Value(dict=pb.ValueDict(items={"pos": pb.Value()}))
    with pytest.raises(CodecError, match=r'^obs\["pos"\]: missing value$'):
        codec.from_value(value, "obs")


@settings(max_examples=200, deadline=None)  # a loaded 2-core machine took 363 ms for one example
@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_escape_as_anything_but_codec_or_decode_errors(data):
    """Random bytes either fail to parse as a message or decode to a CodecError, never a crash."""
    from google.protobuf.message import DecodeError

    try:
        msg = pb.Value.FromString(data)
    except DecodeError:
        return
    with contextlib.suppress(CodecError):
        codec.from_value(msg, "obs")
    with contextlib.suppress(CodecError):
        SpaceCheck(gym.spaces.Box(-1, 1, (2,))).decode(msg, 1)
