"""InfiniteLookbackBuffer: one episode column (observations, actions, ...) plus a lookback on its left.

Same API and index semantics as RLlib 2.60's buffer. Index 0 is the first item after the lookback;
negative indices count from the end (lookback included), or, with `neg_index_as_lookback=True`, to the
left of index 0 into the lookback. Ranges reaching past either end are padded with `fill` when given.

Two storage modes, as in RLlib: a plain list of items while an episode is being built (appends are
list appends), and "finalized" (numpy) mode, where `data` is one array per leaf of the (possibly nested)
items with a leading time axis. Unlike RLlib, which re-concatenates the whole array on every append,
numpy mode keeps spare capacity (doubling when full), so appending stays amortised O(1).

Deliberate differences from RLlib 2.60 (where it is inconsistent): a range overflowing both ends is
padded on both sides, an out-of-range index without `fill` raises IndexError in both modes (RLlib's numpy
fast path wraps around), finalizing an empty buffer gives empty arrays instead of raising, and slices
take positive steps only.
"""

from __future__ import annotations

import operator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import data_equivalence

from rlgate.core.spaces import fill_for_space, one_hot, space_struct
from rlgate.core.tree import batch, first_leaf, flatten, map_structure, unbatch

Indices = int | list[int] | slice | None

# Rows allocated when numpy-mode storage is first created by an append.
_MIN_CAPACITY = 16


class InfiniteLookbackBuffer:
    """One column of an episode: `lookback` items of history followed by the episode's own items."""

    _items: list | None  # list mode's items (None once finalized)
    _store: Any  # finalized mode's struct of arrays, `_capacity` rows, the first `_n` in use

    def __init__(self, data: list | Any | None = None, lookback: int = 0, space: gym.Space | None = None):
        self.space = space
        self.data = [] if data is None else data
        self.lookback = min(lookback, self.len_incl_lookback())

    # --- storage ------------------------------------------------------------------------------------

    @property
    def data(self) -> Any:
        """All items, lookback included: a list, or (finalized) a nested struct of arrays."""
        if self._items is not None:
            return self._items
        n = self._n
        return map_structure(lambda leaf: leaf[:n], self._store)

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, list):
            self._items, self._store, self._n = value, None, 0
        else:
            self._items, self._store, self._n = None, value, len(first_leaf(value))
        self._capacity = self._n

    @property
    def finalized(self) -> bool:
        """True once the data is held as numpy arrays (see `finalize`)."""
        return self._items is None

    @property
    def space(self) -> gym.Space | None:
        return self._space

    @space.setter
    def space(self, value: gym.Space | None) -> None:
        self._space = value
        self._space_struct = space_struct(value)

    @property
    def space_struct(self) -> Any:
        """The space's nesting with leaf spaces as leaves (None without a space)."""
        return self._space_struct

    def len_incl_lookback(self) -> int:
        return len(self._items) if self._items is not None else self._n

    def __len__(self) -> int:
        """Number of items after the lookback."""
        return max(self.len_incl_lookback() - self.lookback, 0)

    def finalize(self) -> None:
        """Switch to numpy mode: stack the items into one array per leaf (no-op if already done)."""
        if self._items is None:
            return
        if self._items:
            self.data = batch(self._items)
        elif self.space is not None:
            self.data = fill_for_space(self.space, 0, 0)
        else:
            self.data = np.zeros((0,), np.float32)

    # --- growing and shrinking -----------------------------------------------------------------------

    def append(self, item: Any) -> None:
        """Append one item at the end (amortised O(1) in both modes)."""
        if self._items is not None:
            self._items.append(item)
            return
        n = self._n
        if n == self._capacity:
            self._reserve(1, map_structure(lambda x: np.asarray(x)[np.newaxis], item) if n == 0 else None)
        store = self._store
        if isinstance(store, np.ndarray):
            store[n] = item
        else:
            map_structure(lambda leaf, value: leaf.__setitem__(n, value), store, item)
        self._n = n + 1

    def extend(self, items: Any) -> None:
        """Append a list of items, or a batch (a struct of arrays with a leading axis)."""
        if self._items is not None:
            self._items.extend(items if isinstance(items, list) else unbatch(items))
            return
        if isinstance(items, list):
            if not items:
                return
            items = batch(items)
        count = len(first_leaf(items))
        n = self._n
        self._reserve(count, items if n == 0 else None)
        map_structure(lambda leaf, rows: leaf.__setitem__(slice(n, n + count), rows), self._store, items)
        self._n = n + count

    def concat(self, other: InfiniteLookbackBuffer) -> None:
        """Append the items of `other` (without its lookback)."""
        self.extend(other.get())

    def pop(self, index: int = -1) -> None:
        """Remove the item at `index` (counted over all items, lookback included) without returning it."""
        if self._items is not None:
            self._items.pop(index)
            return
        n = self._n
        if n == 0:
            raise IndexError("pop from an empty InfiniteLookbackBuffer")
        if index in (-1, n - 1):
            self._n = n - 1
        else:
            self.data = map_structure(lambda leaf: np.delete(leaf, index, axis=0), self.data)

    def _reserve(self, count: int, template: Any) -> None:
        """Make room for `count` more numpy rows; `template` (a batch) shapes the store when it is empty."""
        n = self._n
        if n == 0:
            capacity = max(count, _MIN_CAPACITY)
            self._store = map_structure(lambda t: np.empty((capacity, *t.shape[1:]), t.dtype), template)
            self._capacity = capacity
            return
        if n + count <= self._capacity:
            return
        capacity = max(2 * self._capacity, n + count)

        def grow(leaf: np.ndarray) -> np.ndarray:
            grown = np.empty((capacity, *leaf.shape[1:]), leaf.dtype)
            grown[:n] = leaf[:n]
            return grown

        self._store = map_structure(grow, self._store)
        self._capacity = capacity

    def _writable_store(self) -> Any:
        """The numpy store, copied first if it is read-only (e.g. decoded straight from the wire)."""
        if not all(leaf.flags.writeable for leaf in flatten(self._store)):
            self.data = map_structure(np.array, self.data)
        return self._store

    # --- reading ------------------------------------------------------------------------------------

    def get(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Items at `indices`: an int gives one item, a list or slice a batch (a list in list mode).

        None means all items after the lookback. `fill` pads out-of-range positions (with the space's
        shape and dtype when the buffer has a space); `one_hot_discrete` one-hot encodes Discrete and
        MultiDiscrete leaves, so that padding with `fill=0` is zero-hot.
        """
        if indices is None:
            data = self._rows(self.lookback, self.len_incl_lookback())
            return self._one_hot(data) if one_hot_discrete else data
        if isinstance(indices, slice):
            return self._get_slice(indices, neg_index_as_lookback, fill, one_hot_discrete)
        if isinstance(indices, list):
            items = [self._get_int(i, neg_index_as_lookback, fill, one_hot_discrete) for i in indices]
            if self._items is not None:
                return items
            return batch(items) if items else self._rows(0, 0)
        return self._get_int(operator.index(indices), neg_index_as_lookback, fill, one_hot_discrete)

    def __getitem__(self, indices: Indices) -> Any:
        return self.get(indices)

    def _get_int(self, idx: int, neg_index_as_lookback: bool, fill: Any, one_hot_discrete: bool) -> Any:
        pos = self._position(idx, neg_index_as_lookback)
        if pos is None:
            if fill is None:
                raise IndexError(
                    f"index {idx} (neg_index_as_lookback={neg_index_as_lookback}) is outside the buffer's "
                    f"{self.len_incl_lookback()} items (lookback {self.lookback})"
                )
            return self._fill_item(fill, one_hot_discrete)
        if self._items is not None:
            item = self._items[pos]
        elif isinstance(self._store, np.ndarray):
            item = self._store[pos]
        else:
            item = map_structure(lambda leaf: leaf[pos], self._store)
        return self._one_hot(item) if one_hot_discrete else item

    def _get_slice(self, slice_: slice, neg_index_as_lookback: bool, fill: Any, one_hot_discrete: bool) -> Any:
        start, stop, step, left, right = self._resolve_slice(slice_, neg_index_as_lookback)
        data = self._rows(start, stop, step)
        if one_hot_discrete:
            data = self._one_hot(data)
        if fill is None or not (left or right):
            return data
        if self._items is not None:
            item = self._fill_item(fill, one_hot_discrete)
            return [item] * left + data + [item] * right
        return map_structure(
            lambda before, rows, after: np.concatenate([before, rows, after]),
            self._fill_rows(fill, left, one_hot_discrete),
            data,
            self._fill_rows(fill, right, one_hot_discrete),
        )

    def _rows(self, start: int, stop: int, step: int = 1) -> Any:
        """Items `start:stop:step` of all data (0 <= start, stop <= len_incl_lookback)."""
        if self._items is not None:
            return self._items[start:stop:step]
        return map_structure(lambda leaf: leaf[start:stop:step], self._store)

    def _one_hot(self, data: Any) -> Any:
        if isinstance(data, list):
            return [one_hot(item, self.space_struct) for item in data]
        return one_hot(data, self.space_struct)

    def _fill_item(self, fill: Any, one_hot_discrete: bool) -> Any:
        """One padding item: shaped by the space if known, else like a stored item (and of its dtype: uint8 frames
        padded with `fill=0.0` stay uint8), else `fill` itself."""
        if self.space is not None:
            return fill_for_space(self.space, fill, one_hot_discrete=one_hot_discrete)
        if self._items is None:
            return map_structure(lambda leaf: np.full(leaf.shape[1:], fill, leaf.dtype), self._store)
        return fill

    def _fill_rows(self, fill: Any, count: int, one_hot_discrete: bool) -> Any:
        if self.space is not None:
            return fill_for_space(self.space, fill, count, one_hot_discrete=one_hot_discrete)
        return map_structure(lambda leaf: np.full((count, *leaf.shape[1:]), fill, leaf.dtype), self._store)

    # --- writing ------------------------------------------------------------------------------------

    def set(self, new_data: Any, *, at_indices: Indices = None, neg_index_as_lookback: bool = False) -> None:
        """Overwrite the items at `at_indices` (None: all items after the lookback); never resizes.

        An int takes one item; a list or slice takes a batch of the same length (a list of items, or in
        numpy mode also a struct of arrays). Raises IndexError when positions or lengths do not fit.
        """
        if at_indices is None:
            at_indices = slice(0, None)
        if isinstance(at_indices, slice):
            self._set_slice(new_data, at_indices, neg_index_as_lookback)
        elif isinstance(at_indices, list):
            rows = new_data if isinstance(new_data, list) else unbatch(new_data)
            if len(rows) != len(at_indices):
                raise IndexError(f"{len(rows)} new items for {len(at_indices)} indices")
            for idx, row in zip(at_indices, rows, strict=True):
                self._set_int(row, idx, neg_index_as_lookback)
        else:
            self._set_int(new_data, operator.index(at_indices), neg_index_as_lookback)

    def __setitem__(self, indices: Indices, value: Any) -> None:
        self.set(value, at_indices=indices)

    def _set_int(self, item: Any, idx: int, neg_index_as_lookback: bool) -> None:
        pos = self._position(idx, neg_index_as_lookback)
        if pos is None:
            raise IndexError(
                f"cannot set index {idx} (neg_index_as_lookback={neg_index_as_lookback}): outside the "
                f"buffer's {self.len_incl_lookback()} items"
            )
        if self._items is not None:
            self._items[pos] = item
        else:
            map_structure(lambda leaf, value: leaf.__setitem__(pos, value), self._writable_store(), item)

    def _set_slice(self, new_data: Any, slice_: slice, neg_index_as_lookback: bool) -> None:
        start, stop, step, _, _ = self._resolve_slice(slice_, neg_index_as_lookback)
        count = len(range(start, stop, step))
        new_count = len(new_data) if isinstance(new_data, list) else len(first_leaf(new_data))
        if new_count != count:
            raise IndexError(
                f"cannot set {slice_} (neg_index_as_lookback={neg_index_as_lookback}): it covers {count} "
                f"items, new data has {new_count}"
            )
        if not count:
            return
        if self._items is not None:
            self._items[start:stop:step] = new_data if isinstance(new_data, list) else unbatch(new_data)
            return
        rows = batch(new_data) if isinstance(new_data, list) else new_data
        target = slice(start, stop, step)
        map_structure(lambda leaf, value: leaf.__setitem__(target, value), self._writable_store(), rows)

    # --- index arithmetic ---------------------------------------------------------------------------

    def _position(self, idx: int, neg_index_as_lookback: bool) -> int | None:
        """Position of `idx` among all items (lookback included), or None when out of range."""
        total = self.len_incl_lookback()
        pos = self.lookback + idx if idx >= 0 or neg_index_as_lookback else total + idx
        return pos if 0 <= pos < total else None

    def _resolve_slice(self, slice_: slice, neg_index_as_lookback: bool) -> tuple[int, int, int, int, int]:
        """(start, stop, step) clamped to all items, plus how many positions overflow left and right."""
        step = 1 if slice_.step is None else slice_.step
        if step <= 0:
            raise ValueError(f"InfiniteLookbackBuffer slices need a positive step, got {step}")
        total, lookback = self.len_incl_lookback(), self.lookback

        def absolute(index: int | None, default: int) -> int:
            if index is None:
                return default
            return lookback + index if index >= 0 or neg_index_as_lookback else total + index

        start, stop = absolute(slice_.start, lookback), absolute(slice_.stop, total)
        left = max(0, min(stop, 0) - start)
        right = max(0, stop - max(start, total))
        return min(max(start, 0), total), min(max(stop, 0), total), step, left, right

    # --- state --------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The buffer as a plain dict (data, lookback, finalized, space); see `from_state`."""
        return {
            "data": self.data,
            "lookback": self.lookback,
            "finalized": self.finalized,
            "space": self.space,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> InfiniteLookbackBuffer:
        """Rebuild a buffer from `get_state()`'s dict (the data is shared, not copied)."""
        buffer = InfiniteLookbackBuffer(space=state["space"])
        buffer.data = state["data"]
        buffer.lookback = state["lookback"]
        return buffer

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InfiniteLookbackBuffer)
            and self.lookback == other.lookback
            and self.finalized == other.finalized
            and self.space == other.space
            and data_equivalence(self.data, other.data)
        )

    def __repr__(self) -> str:
        total = self.len_incl_lookback()
        return (
            f"{type(self).__name__}({self._rows(0, self.lookback)} <- lookback({self.lookback}) | "
            f"{self._rows(self.lookback, total)})"
        )
