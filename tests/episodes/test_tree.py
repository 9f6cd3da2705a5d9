"""The nested-structure helpers: map, flatten, batch, unbatch."""

import numpy as np
import pytest

from rlgate.core.tree import batch, first_leaf, flatten, map_structure, stack, unbatch


def test_map_structure_keeps_nesting_and_key_order():
    struct = {"b": (1, 2), "a": 3}
    result = map_structure(lambda x, y: x + y, struct, {"a": 30, "b": (10, 20)})
    assert result == {"b": (11, 22), "a": 33}
    assert list(result) == ["b", "a"]


def test_lists_are_leaves_not_nesting():
    assert map_structure(len, {"a": [1, 2, 3]}) == {"a": 3}
    assert flatten([1, 2]) == [[1, 2]]


def test_mismatched_tuple_lengths_raise():
    with pytest.raises(ValueError):
        map_structure(lambda x, y: x, (1, 2), (1,))


def test_flatten_and_first_leaf():
    struct = {"x": (np.zeros(1), {"y": 5}), "z": 7}
    assert [type(leaf) for leaf in flatten(struct)] == [np.ndarray, int, int]
    assert first_leaf(struct) is struct["x"][0]
    assert first_leaf(4) == 4


def test_stack_arrays_scalars_and_numbers():
    rows = [np.arange(3, dtype=np.float32) + i for i in range(4)]
    stacked = stack(rows)
    assert stacked.shape == (4, 3) and stacked.dtype == np.float32
    np.testing.assert_array_equal(stacked[2], rows[2])
    assert stack([np.float32(1.5), np.float32(2)]).dtype == np.float32
    assert stack([1, 2.5]).dtype == np.float64
    assert stack([1, 2]).dtype == np.int64
    assert stack([np.str_("a"), np.str_("longer")]).tolist() == ["a", "longer"]  # no fixed-width truncation


def test_batch_unbatch_round_trip_nested():
    items = [{"a": np.int64(i), "b": (np.full(2, i, np.float32), i * 1.0)} for i in range(3)]
    batched = batch(items)
    assert batched["a"].tolist() == [0, 1, 2]
    assert batched["b"][0].shape == (3, 2)
    assert batched["b"][1].dtype == np.float64
    back = unbatch(batched)
    assert len(back) == 3
    assert back[1]["a"] == 1 and back[1]["b"][0].tolist() == [1.0, 1.0]


def test_unbatch_flat_array():
    assert [x.tolist() for x in unbatch(np.arange(6).reshape(3, 2))] == [[0, 1], [2, 3], [4, 5]]
