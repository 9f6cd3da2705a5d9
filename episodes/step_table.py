"""StepTable: one session's recent steps, column by column, as [rows, sub-envs, ...] arrays.

Row r holds what one step message brought and what the server answered to it: the N sub-envs'
observations, rewards, flags, infos, and the actions and model outputs computed for them. A column is
a (possibly nested) struct of arrays, created from the first value written to it, so writing a
message is one array assignment per leaf, whatever N is. Rows that no episode needs any more are
dropped from the front when the table is full (it doubles only when most rows are still in use), so
its size follows the longest running chunk, not the session's age.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlgate.core.tree import map_structure

_MIN_ROWS = 16


class StepTable:
    """Columns of [rows, num_envs, ...] arrays; `first` is the global index of stored row 0."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.first = 0  # global row index of the first stored row
        self.rows = 0  # rows stored (global indices first .. first + rows - 1)
        self._capacity = _MIN_ROWS
        self._columns: dict[str, Any] = {}
        self.infos: list[list[dict] | None] = []

    def __contains__(self, column: str) -> bool:
        return column in self._columns

    @property
    def capacity(self) -> int:
        """Rows allocated per column (the table's memory is bounded by this)."""
        return self._capacity

    @property
    def full(self) -> bool:
        """True when the next `new_row` needs `make_room` first."""
        return self.rows == self._capacity

    def make_room(self, keep_from: int) -> None:
        """Drop the rows before global index `keep_from` if they are half the table or more, else grow."""
        drop = keep_from - self.first
        if drop * 2 >= self.rows:
            self._drop_front(drop)
        else:
            self._grow()

    def new_row(self) -> int:
        """Add a row (call `make_room` first when `full`) and return its global index."""
        self.rows += 1
        self.infos.append(None)
        return self.first + self.rows - 1

    def put(self, column: str, row: int, value: Any) -> None:
        """Write `value` ([num_envs, ...], possibly nested) into `column` at global row `row`."""
        store = self._columns.get(column)
        if store is None:
            store = self._columns[column] = map_structure(self._allocate, value)
        r = row - self.first
        if isinstance(store, np.ndarray):
            store[r] = value
        else:
            map_structure(lambda leaf, v: leaf.__setitem__(r, v), store, value)

    def get(self, column: str, start: int, stop: int, env: int) -> Any:
        """A copy of global rows start .. stop - 1 of sub-env `env` in `column`: [stop - start, ...]."""
        return map_structure(np.copy, self.view(column, start, stop, env))

    def view(self, column: str, start: int, stop: int, env: int) -> Any:
        """Like `get`, but views into the table: valid only until the next write (for encoding at once)."""
        a, b = start - self.first, stop - self.first
        return map_structure(lambda leaf: leaf[a:b, env], self._columns[column])

    def get_infos(self, start: int, stop: int, env: int) -> list[dict]:
        """Sub-env `env`'s infos of global rows start .. stop - 1 (empty dicts where none were sent)."""
        rows = self.infos[start - self.first : stop - self.first]
        return [{} if infos is None else infos[env] for infos in rows]

    def _allocate(self, value: Any) -> np.ndarray:
        value = np.asarray(value)
        if value.shape[:1] != (self.num_envs,):
            raise ValueError(f"a step table row needs {self.num_envs} sub-envs, got shape {value.shape}")
        return np.empty((self._capacity, *value.shape), value.dtype)

    def _drop_front(self, drop: int) -> None:
        n = self.rows - drop
        for store in self._columns.values():
            map_structure(lambda leaf: leaf.__setitem__(slice(0, n), leaf[drop : self.rows]), store)
        del self.infos[:drop]
        self.first += drop
        self.rows = n

    def _grow(self) -> None:
        self._capacity *= 2

        def grown(leaf: np.ndarray) -> np.ndarray:
            bigger = np.empty((self._capacity, *leaf.shape[1:]), leaf.dtype)
            bigger[: self.rows] = leaf[: self.rows]
            return bigger

        self._columns = {name: map_structure(grown, store) for name, store in self._columns.items()}
