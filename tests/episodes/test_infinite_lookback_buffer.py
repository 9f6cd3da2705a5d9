"""InfiniteLookbackBuffer: index semantics (checked against RLlib 2.60), both storage modes, growth."""

import gymnasium as gym
import numpy as np
import pytest

from rlgate.episodes import InfiniteLookbackBuffer


def values(x):
    """Plain Python values of a list-mode or numpy-mode result, for comparison."""
    if isinstance(x, dict):
        return {k: values(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [values(v) for v in x]
    return np.asarray(x).tolist()


# --- reading ------------------------------------------------------------------------------------------


def test_index_zero_is_first_item_after_lookback(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([4, 5, 6, 7, 8, 9], lookback=3))
    assert len(buffer) == 3 and buffer.len_incl_lookback() == 6
    assert values(buffer.get()) == [7, 8, 9]
    assert values(buffer.get(0)) == 7
    assert values(buffer.get(-1)) == 9
    assert values(buffer.get(-6)) == 4  # plain negative indices count from the end, lookback included
    assert values(buffer[1:]) == [8, 9]


def test_neg_index_as_lookback_reaches_left_of_zero(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([4, 5, 6, 7, 8, 9], lookback=3))
    assert values(buffer.get(-1, neg_index_as_lookback=True)) == 6
    assert values(buffer.get(slice(-2, 1), neg_index_as_lookback=True)) == [5, 6, 7]
    assert values(buffer.get([-3, 0], neg_index_as_lookback=True)) == [4, 7]


def test_fill_pads_left_of_the_lookback(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([10, 11, 12, 13, 14], lookback=2))
    assert values(buffer.get(slice(-7, -2), fill=0.0)) == [0.0, 0.0, 10, 11, 12]
    assert values(buffer.get(slice(-5, 1), neg_index_as_lookback=True, fill=-1)) == [-1, -1, -1, 10, 11, 12]


def test_rllib_docstring_examples_discrete(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([0, 1, 2, 3], space=gym.spaces.Discrete(4)))
    assert values(buffer.get(-1)) == 3
    assert values(buffer.get([0, 2])) == [0, 2]
    assert values(buffer.get([-1, 0])) == [3, 0]
    assert values(buffer.get(slice(None, 2))) == [0, 1]
    assert values(buffer.get(slice(-2, None))) == [2, 3]
    assert values(buffer.get(slice(-6, -2), fill=-9)) == [-9, -9, 0, 1]
    assert values(buffer.get(slice(2, 5), fill=-7)) == [2, 3, -7]
    assert values(buffer.get(2, one_hot_discrete=True)) == [0, 0, 1, 0]
    assert values(buffer.get(slice(0, 3), one_hot_discrete=True)) == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    # Padding with fill=0 and one_hot_discrete gives zero-hot vectors.
    zero_hot = buffer.get(-1, neg_index_as_lookback=True, fill=0.0, one_hot_discrete=True)
    assert values(zero_hot) == [0, 0, 0, 0]
    assert np.asarray(zero_hot).dtype == np.float32


def test_one_hot_with_fill_in_a_slice_is_zero_hot_at_the_padding(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([1, 2], space=gym.spaces.Discrete(3)))
    got = buffer.get(slice(-2, 1), neg_index_as_lookback=True, fill=0, one_hot_discrete=True)
    assert values(got) == [[0, 0, 0], [0, 0, 0], [0, 1, 0]]


def test_fill_uses_the_space_dtype_and_shape(in_mode):
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    buffer = in_mode(InfiniteLookbackBuffer([np.ones(2, np.float32)], space=space))
    padded = buffer.get(5, fill=0.5)
    assert padded.dtype == np.float32 and padded.tolist() == [0.5, 0.5]
    rows = buffer.get(slice(0, 3), fill=0)
    assert values(rows) == [[1, 1], [0, 0], [0, 0]]


def test_fill_without_space():
    listed = InfiniteLookbackBuffer([1.0, 2.0])
    assert listed.get(5, fill=-1) == -1  # list mode hands back `fill` itself, as RLlib does
    assert listed.get(slice(-1, 1), neg_index_as_lookback=True, fill=0) == [0, 1.0]
    arrays = InfiniteLookbackBuffer(np.ones((2, 3), np.float32))
    assert arrays.get(slice(1, 3), fill=0).tolist() == [[1, 1, 1], [0, 0, 0]]  # padded like stored items
    assert arrays.get(7, fill=2).tolist() == [2, 2, 2]


def test_fill_without_space_keeps_the_stored_dtype():
    """uint8 frames padded with FrameStacking's `fill=0.0` stay uint8 (were float64, then float32 tensors: four
    times the bytes of every frame stack, from an episode made without its observation space)."""
    frames = InfiniteLookbackBuffer(np.full((2, 4, 4, 1), 7, np.uint8))
    stack = frames.get(slice(-4, None), fill=0.0)
    assert stack.dtype == np.uint8 and stack[:, 0, 0, 0].tolist() == [0, 0, 7, 7]
    assert frames.get(5, fill=0.0).dtype == np.uint8


def test_range_overflowing_both_ends_is_padded_on_both_sides(in_mode):
    # RLlib 2.60 pads only the left side here (returning fewer items than asked); we pad both.
    buffer = in_mode(InfiniteLookbackBuffer([1, 2], lookback=1))
    assert values(buffer.get(slice(-3, 3), neg_index_as_lookback=True, fill=0)) == [0, 0, 1, 2, 0, 0]


def test_out_of_range_without_fill_raises(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([1, 2, 3], lookback=1))
    with pytest.raises(IndexError):
        buffer.get(2)
    with pytest.raises(IndexError):
        buffer.get(-4)
    with pytest.raises(IndexError):  # RLlib's numpy fast path wraps around here instead
        buffer.get(-2, neg_index_as_lookback=True)
    assert values(buffer.get(slice(0, 10))) == [2, 3]  # slices clamp, as Python's do


def test_list_indices_and_integer_types(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([5, 6, 7]))
    assert values(buffer.get(np.int64(1))) == 6
    assert values(buffer.get([2, 0, 5], fill=0)) == [7, 5, 0]
    assert values(buffer.get([])) == []
    with pytest.raises(TypeError):
        buffer.get("0")


def test_slice_steps(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer(list(range(6)), lookback=1))
    assert values(buffer.get(slice(0, None, 2))) == [1, 3, 5]
    with pytest.raises(ValueError, match="positive step"):
        buffer.get(slice(None, None, -1))


def test_one_hot_needs_a_space():
    with pytest.raises(ValueError, match="space"):
        InfiniteLookbackBuffer([0, 1]).get(0, one_hot_discrete=True)


def test_one_hot_multi_discrete(in_mode):
    space = gym.spaces.MultiDiscrete([2, 3])
    buffer = in_mode(InfiniteLookbackBuffer([np.array([1, 2]), np.array([0, 0])], space=space))
    assert values(buffer.get(0, one_hot_discrete=True)) == [0, 1, 0, 0, 1]
    assert values(buffer.get(slice(0, 3), fill=0, one_hot_discrete=True)) == [
        [0, 1, 0, 0, 1],
        [1, 0, 1, 0, 0],
        [0, 0, 0, 0, 0],
    ]


def test_nested_items_with_fill_and_one_hot(in_mode, nested_obs_space):
    items = [
        {"pos": np.array([0.5, -0.5], np.float32), "inner": (np.int64(2), np.array([1, 3]))},
        {"pos": np.array([0.25, 0.75], np.float32), "inner": (np.int64(0), np.array([0, 1]))},
    ]
    buffer = in_mode(InfiniteLookbackBuffer(items, lookback=1, space=nested_obs_space))
    got = buffer.get(slice(-2, 1), neg_index_as_lookback=True, fill=0, one_hot_discrete=True)
    expected = [
        {"pos": [0, 0], "inner": [[0, 0, 0], [0, 0, 0, 0, 0, 0]]},
        {"pos": [0.5, -0.5], "inner": [[0, 0, 1], [0, 1, 0, 0, 0, 1]]},
        {"pos": [0.25, 0.75], "inner": [[1, 0, 0], [1, 0, 0, 1, 0, 0]]},
    ]
    if buffer.finalized:  # one struct of batched arrays
        assert values(got) == {
            "pos": [e["pos"] for e in expected],
            "inner": [[e["inner"][0] for e in expected], [e["inner"][1] for e in expected]],
        }
        assert got["pos"].dtype == np.float32
    else:  # a list of items
        assert values(got) == expected


# --- writing ------------------------------------------------------------------------------------------


def test_set_int_list_slice_and_all(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([4, 5, 6, 7, 8, 9], lookback=3))
    buffer.set(99, at_indices=-1, neg_index_as_lookback=True)
    buffer.set([98, 97, 96], at_indices=slice(-3, 0), neg_index_as_lookback=True)
    buffer[0] = 70
    buffer.set([80, 90], at_indices=[1, 2])
    assert values(buffer.data) == [98, 97, 96, 70, 80, 90]
    buffer.set([1, 2, 3])  # None: everything after the lookback
    assert values(buffer.data) == [98, 97, 96, 1, 2, 3]


def test_set_checks_lengths_and_range(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([1, 2, 3]))
    with pytest.raises(IndexError):
        buffer.set([1, 2], at_indices=slice(0, 3))
    with pytest.raises(IndexError):
        buffer.set(5, at_indices=3)
    with pytest.raises(IndexError):
        buffer.set([1], at_indices=[0, 1])
    assert values(buffer.data) == [1, 2, 3]


def test_set_nested_numpy_takes_a_batch(nested_obs_space):
    items = [nested_obs_space.sample() for _ in range(3)]
    buffer = InfiniteLookbackBuffer(items, space=nested_obs_space)
    buffer.finalize()
    new = {"pos": np.zeros((2, 2), np.float32), "inner": (np.array([1, 1]), np.array([[0, 0], [1, 1]]))}
    buffer.set(new, at_indices=slice(1, 3))
    assert buffer.get(2)["inner"][1].tolist() == [1, 1]
    assert buffer.get(0)["pos"].tolist() == pytest.approx(items[0]["pos"].tolist())


def test_set_on_read_only_arrays_copies_first():
    source = np.arange(4)
    source.flags.writeable = False
    buffer = InfiniteLookbackBuffer(source)
    buffer.set(9, at_indices=0)
    assert buffer.get(0) == 9
    assert source.tolist() == [0, 1, 2, 3]


# --- growing and shrinking ------------------------------------------------------------------------------


def test_append_extend_pop(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([1, 2], lookback=1))
    buffer.append(3)
    buffer.extend([4, 5])
    buffer.extend(np.array([6]))
    assert values(buffer.data) == [1, 2, 3, 4, 5, 6] and len(buffer) == 5
    buffer.pop()
    buffer.pop(0)
    assert values(buffer.data) == [2, 3, 4, 5]


def test_numpy_append_is_amortised(nested_obs_space):
    """Appending to a finalized buffer reallocates O(log n) times, never once per step."""
    flat = InfiniteLookbackBuffer(np.zeros((1, 4), np.float32))
    nested = InfiniteLookbackBuffer([nested_obs_space.sample()], space=nested_obs_space)
    nested.finalize()
    stores, nested_stores = [flat.data.base], [nested.data["pos"].base]
    for i in range(1000):
        flat.append(np.full(4, i, np.float32))
        nested.append(nested_obs_space.sample())
        if flat.data.base is not stores[-1]:
            stores.append(flat.data.base)
        if nested.data["pos"].base is not nested_stores[-1]:
            nested_stores.append(nested.data["pos"].base)
    assert len(stores) <= 12 and len(nested_stores) <= 12
    assert flat.data.shape == (1001, 4) and flat.get(-1).tolist() == [999] * 4
    assert nested.data["inner"][1].shape == (1001, 2)


def test_views_handed_out_survive_later_appends():
    buffer = InfiniteLookbackBuffer(np.arange(3))
    before = buffer.get()
    for i in range(100):
        buffer.append(i)
    assert before.tolist() == [0, 1, 2]


def test_finalize_empty_buffer_then_append():
    typed = InfiniteLookbackBuffer(space=gym.spaces.Box(-1, 1, (3,), np.float32))
    typed.finalize()
    assert typed.finalized and typed.data.shape == (0, 3) and typed.data.dtype == np.float32
    untyped = InfiniteLookbackBuffer()
    untyped.finalize()
    untyped.append(np.ones(2))
    assert untyped.data.shape == (1, 2)
    with pytest.raises(IndexError):
        InfiniteLookbackBuffer(np.zeros((0,))).pop()


def test_list_mode_extend_takes_a_batch():
    buffer = InfiniteLookbackBuffer([{"a": 0}])
    buffer.extend({"a": np.array([1, 2])})
    assert [item["a"] for item in buffer.data] == [0, 1, 2]


def test_concat_skips_the_other_lookback(in_mode):
    buffer = in_mode(InfiniteLookbackBuffer([1, 2]))
    buffer.concat(InfiniteLookbackBuffer([2, 3, 4], lookback=1))
    assert values(buffer.data) == [1, 2, 3, 4]


def test_lookback_is_clamped_to_the_data():
    assert InfiniteLookbackBuffer([1, 2], lookback=5).lookback == 2
    assert len(InfiniteLookbackBuffer([1, 2], lookback=5)) == 0


# --- state, equality, repr -------------------------------------------------------------------------------


def test_state_round_trip_and_equality(in_mode, nested_obs_space):
    buffer = in_mode(InfiniteLookbackBuffer([nested_obs_space.sample() for _ in range(4)], 2, nested_obs_space))
    state = buffer.get_state()
    assert state["lookback"] == 2 and state["finalized"] == buffer.finalized and state["space"] == nested_obs_space
    restored = InfiniteLookbackBuffer.from_state(state)
    assert restored == buffer
    restored.set(restored.get(0), at_indices=1)
    assert restored != InfiniteLookbackBuffer.from_state(InfiniteLookbackBuffer([1]).get_state())


def test_repr_shows_the_lookback():
    assert repr(InfiniteLookbackBuffer([1, 2, 3], lookback=1)) == "InfiniteLookbackBuffer([1] <- lookback(1) | [2, 3])"
