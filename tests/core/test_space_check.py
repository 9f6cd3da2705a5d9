"""SpaceCheck: what a value of a space may be on the wire, what it becomes, and how a bad one is named."""

import gymnasium as gym
import numpy as np
import pytest

from rlgate.core import codec
from rlgate.core.codec import CodecError
from rlgate.core.space_check import SMALL, FlagsCheck, NonFiniteError, SpaceCheck
from rlgate.core.space_diff import space_differences
from rlgate.v1 import tensor_pb2 as pb

BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
POS = gym.spaces.Dict({"pos": gym.spaces.Box(-10, 10, (2,)), "mode": gym.spaces.Discrete(3)})
HALF_OPEN = gym.spaces.Box(np.array([0, -np.inf], np.float32), np.array([1, np.inf], np.float32))


def decode(space: gym.Space, value, rows: int, **kwargs):
    return SpaceCheck(space, **kwargs).decode(codec.to_value(value), rows)


# value, space, rows, the error message (a regular expression)
MALFORMED = [
    (np.zeros((1, 3), np.float32), BOX, 1, r"^obs: shape \(1, 3\) != \(1, 2\)$"),
    (np.zeros((1, 2), np.int64), BOX, 1, r"^obs: dtype int64 does not fit Box of float32 \(send a float\)$"),
    (np.array([[0.0, np.nan]], np.float32), BOX, 1, r"^obs: NaN at index \(0, 1\)$"),
    (
        np.array([[0.0, 2.0]], np.float32),
        BOX,
        1,
        r"^obs: value 2.0 at index \(0, 1\) outside the Box bounds \[-1.0, 1.0\]$",
    ),
    (np.array([[0.5, np.inf]], np.float32), HALF_OPEN, 1, r"^obs: value inf at index \(0, 1\) is not finite$"),
    (np.array([[0.5, 1e300]]), HALF_OPEN, 1, r"^obs: value inf at index \(0, 1\) is not finite$"),  # float64 -> inf
    (np.array([5]), gym.spaces.Discrete(5), 1, r"^obs: value 5 at index \(0,\) outside the Discrete bounds \[0, 4\]$"),
    (np.array([-1]), gym.spaces.Discrete(5), 1, r"outside the Discrete bounds"),
    (np.array([2**63 + 5], np.uint64), gym.spaces.Discrete(5), 1, r"outside the Discrete bounds"),
    (
        np.array([1.0]),
        gym.spaces.Discrete(5),
        1,
        r"^obs: dtype float64 does not fit Discrete of int64 \(send an integer\)$",
    ),
    (
        np.array([[1, 3]]),
        gym.spaces.MultiDiscrete([2, 3]),
        1,
        r"value 3 at index \(0, 1\) outside the MultiDiscrete bounds \[0, 2\]",
    ),
    (np.array([[0, 2]], np.int8), gym.spaces.MultiBinary(2), 1, r"outside the MultiBinary bounds \[0, 1\]"),
    (np.array([[300]], np.int64), gym.spaces.Box(0, 255, (1,), np.uint8), 1, r"value 300 .* outside the Box bounds"),
    (np.zeros((2, 2), np.float32), BOX, 3, r"shape \(2, 2\) != \(3, 2\)"),
    (
        {"pos": np.zeros((1, 3), np.float32), "mode": np.array([1])},
        POS,
        1,
        r'^obs\["pos"\]: shape \(1, 3\) != \(1, 2\)$',
    ),
    ({"pos": np.zeros((1, 2), np.float32)}, POS, 1, r"^obs: keys \['pos'\] != \['mode', 'pos'\]$"),
    (np.zeros((1, 2), np.float32), POS, 1, r"^obs: expected a dict, got a tensor$"),
    ((np.array([1]),), gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2), 1, r"^obs: 1 items != 2$"),
    ((np.array([1]), np.array([1.0])), gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2), 1, r"^obs\[1\]: dtype"),
    ({"a": np.array([1])}, gym.spaces.Tuple([gym.spaces.Discrete(2)]), 1, r"^obs: expected a tuple, got a dict$"),
]


@pytest.mark.parametrize(("value", "space", "rows", "message"), MALFORMED)
def test_malformed_values_are_rejected_with_path_and_mismatch(value, space, rows, message):
    with pytest.raises(CodecError, match=message):
        decode(space, value, rows)


def test_a_missing_value_and_a_short_buffer_are_named():
    with pytest.raises(CodecError, match=r'^obs\["pos"\]: expected a tensor, got nothing \(missing value\)$'):
        mode = codec.to_value(np.array([1]))
        SpaceCheck(POS).decode(pb.Value(dict=pb.ValueDict(items={"pos": pb.Value(), "mode": mode})), 1)
    short = pb.Value(tensor=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[1, 2], data=b"\0" * 7))
    with pytest.raises(CodecError, match=r"^obs: 7 data bytes != 8 for shape \(1, 2\) of float32$"):
        SpaceCheck(BOX).decode(short, 1)


@pytest.mark.parametrize("rows", [1, SMALL, SMALL + 1])  # the Python and the numpy test of the bounds
def test_non_finite_values_raise_non_finite_error_with_the_field(rows):
    value = np.zeros((rows, 2), np.float32)
    value[-1, 1] = np.inf
    with pytest.raises(NonFiniteError, match=rf"^reward: value inf at index \({rows - 1}, 1\) is not finite$") as info:
        decode(HALF_OPEN, value, rows, path="reward")
    assert info.value.field == "reward"
    value[-1, 1] = 0.5
    value[0, 0] = 1.5
    with pytest.raises(CodecError, match=r"^obs: value 1.5 at index \(0, 0\) outside the Box bounds \[0.0, 1.0\]$"):
        decode(HALF_OPEN, value, rows)


def test_infinities_pass_where_allowed_and_the_bound_is_infinite():
    value = np.array([[0.5, -np.inf], [1.0, np.inf]], np.float32)
    np.testing.assert_array_equal(decode(HALF_OPEN, value, 2, allow_infinite=True), value)
    with pytest.raises(NonFiniteError, match="NaN"):
        decode(HALF_OPEN, np.array([[np.nan, 0.0]], np.float32), 1, allow_infinite=True)
    with pytest.raises(NonFiniteError, match="not finite"):  # a finite bound keeps its infinity out
        decode(HALF_OPEN, np.array([[np.inf, 0.0]], np.float32), 1, allow_infinite=True)


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (BOX, np.array([[0.25, -1.0]], np.float64)),
        (BOX, np.array([[0.25, -1.0]], np.float16)),
        (gym.spaces.Discrete(3, start=-1), np.array([1, -1], np.int8)),
        (gym.spaces.Discrete(3), np.array([2], np.uint64)),
        (gym.spaces.MultiDiscrete([2, 3]), np.array([[1, 2]], np.int32)),
        (gym.spaces.MultiBinary(3), np.array([[True, False, True]])),
        (gym.spaces.MultiBinary(3), np.array([[1, 0, 1]], np.uint8)),
        (gym.spaces.Box(0, 255, (2,), np.uint8), np.array([[0, 255]], np.int64)),
    ],
)
def test_values_of_the_same_kind_are_converted_to_the_space_dtype(space, value):
    decoded = decode(space, value, len(value))
    assert decoded.dtype == space.dtype
    np.testing.assert_array_equal(decoded, value.astype(space.dtype))
    assert space.contains(decoded[0])


def test_a_value_in_the_space_dtype_is_not_copied():
    value = codec.to_value(np.zeros((4, 2), np.float32))
    decoded = SpaceCheck(BOX).decode(value, 4)
    assert not decoded.flags.owndata and not decoded.flags.writeable


def test_flags_must_be_bool_of_one_per_row():
    flags = FlagsCheck("terminated")
    np.testing.assert_array_equal(flags.decode_tensor(codec.to_tensor(np.array([True, False])), 2), [True, False])
    with pytest.raises(CodecError, match=r"^terminated: dtype int64 is not bool$"):
        flags.decode_tensor(codec.to_tensor(np.array([1, 0])), 2)
    with pytest.raises(CodecError, match=r"^terminated: shape \(3,\) != \(2,\)$"):
        flags.decode_tensor(codec.to_tensor(np.zeros(3, bool)), 2)
    with pytest.raises(CodecError, match=r"^terminated: 1 data bytes != 2"):
        flags.decode_tensor(pb.Tensor(dtype=pb.DTYPE_BOOL, shape=[2], data=b"\1"), 2)
    with pytest.raises(CodecError, match=r"^terminated: bool byte 255 at byte 1: a bool is one byte, 0 or 1$"):
        flags.decode_tensor(pb.Tensor(dtype=pb.DTYPE_BOOL, shape=[2], data=b"\1\xff"), 2)


@pytest.mark.parametrize(
    "space", [gym.spaces.MultiBinary(3), gym.spaces.Box(0, 1, (3,), np.bool_)], ids=["multibinary", "bool-box"]
)
def test_bool_values_must_be_bytes_0_or_1(space):
    """numpy reads a byte of 2 as True but keeps it: it would reach episodes as itself."""
    check = SpaceCheck(space)
    good = pb.Value(tensor=pb.Tensor(dtype=pb.DTYPE_BOOL, shape=[1, 3], data=b"\1\0\1"))
    np.testing.assert_array_equal(check.decode(good, 1), [[1, 0, 1]])
    bad = pb.Value(tensor=pb.Tensor(dtype=pb.DTYPE_BOOL, shape=[1, 3], data=b"\1\2\1"))
    with pytest.raises(CodecError, match=r"^obs: bool byte 2 at byte 1: a bool is one byte, 0 or 1$"):
        check.decode(bad, 1)


def test_space_differences_name_only_the_differing_fields():
    cartpole = gym.make("CartPole-v1").observation_space
    clipped = gym.spaces.Box(np.maximum(cartpole.low, -1e6), np.minimum(cartpole.high, 1e6), dtype=np.float32)
    assert space_differences(cartpole, clipped, "obs") == [
        "obs.low[1]: -inf != -1000000.0 (and 1 more)",
        "obs.high[1]: inf != 1000000.0 (and 1 more)",
    ]
    assert space_differences(cartpole, cartpole, "obs") == []
    assert space_differences(POS, gym.spaces.Dict({"pos": POS["pos"], "mode": gym.spaces.Discrete(4)}), "o") == [
        'o["mode"].n: 3 != 4'
    ]
    assert space_differences(BOX, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "obs") == ["obs.shape: (2,) != (3,)"]
    assert space_differences(BOX, gym.spaces.Discrete(2), "obs") == ["obs: Box != Discrete"]


def test_rows_none_decodes_one_value_without_a_leading_axis():
    """A multi-agent step carries each agent's observation unbatched: rows=None checks it as one value."""
    check = SpaceCheck(POS, path="obs['a']")
    value = check.decode(codec.to_value({"pos": np.array([1.0, -2.0], np.float32), "mode": np.array(2)}), None)
    assert value["pos"].shape == (2,) and int(value["mode"]) == 2
    with pytest.raises(CodecError, match=r"""^obs\['a'\]\["pos"\]: shape \(1, 2\) != \(2,\)$"""):
        check.decode(codec.to_value({"pos": np.zeros((1, 2), np.float32), "mode": np.array(0)}), None)
    with pytest.raises(CodecError, match=r"^obs: value 2.0 at index \(1,\) outside the Box bounds \[-1.0, 1.0\]$"):
        SpaceCheck(BOX).decode(codec.to_value(np.array([0.0, 2.0], np.float32)), None)
