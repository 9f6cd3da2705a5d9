"""EpisodeReplayBuffer: the episodes an off-policy learner receives, replayed as n-step transitions (RLlib's).

As RLlib's `EpisodeReplayBuffer`: it stores episodes by id, a later chunk of an episode is joined onto it, its
capacity counts env steps and the oldest episodes are evicted (whole) while it holds more (never the last one),
and `sample(num_items, n_step=..., gamma=...)` draws time steps uniformly and returns one-step episodes
`(o_t, a_t, sum_k gamma^k r_(t+k), o_(t+n), terminated, truncated)` with `n_step` and `weights` among their
extra model outputs: n fixed or drawn per sample from a range, stopping early at the episode's end (whose
flags the transition then carries) or where its data ends so far.

Differences from RLlib 2.60, deliberate: a range `n_step=(low, high)` is drawn from the closed interval RLlib's
docs describe (its code leaves `high` out); `n_step` holds the steps a transition really spans (RLlib's holds
the n drawn, so a transition cut short by the data's end bootstraps with too small a discount); a chunk that
does not start where its episode's data ends (one was lost in between) is kept, but no transition reaches across
the gap (RLlib's `concat_episode` raises).

The steps are held column by column in numpy arrays, each step with the observation after it and the row of the
step that follows it, so that `sample_transitions` (the learner's fast path: the same transitions as `sample`, as
batch columns) gathers a batch in a few vectorised operations instead of slicing episodes one by one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlgate.core.columns import Columns
from rlgate.core.tree import batch as stack_items
from rlgate.core.tree import flatten, map_structure
from rlgate.episodes import SingleAgentEpisode

#: The extra model output of a sampled transition that holds the env steps it spans (RLlib's name).
N_STEP = "n_step"
#: The extra model output of a sampled transition that holds its importance-sampling weight (RLlib's name).
WEIGHTS = "weights"

NStep = int | tuple[int, int]


@dataclass
class _Stored:
    """One episode in the buffer: its rows in order, the `t` its data reaches, and whether it ended."""

    serial: int
    rows: list[np.ndarray] = field(default_factory=list)
    length: int = 0
    t: int = 0
    done: bool = False

    @property
    def last_row(self) -> int:
        return int(self.rows[-1][-1]) if self.rows else -1


class EpisodeReplayBuffer:
    """Episodes by id, sampled as n-step transitions; `capacity` env steps, the oldest episodes evicted."""

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 env step, got {capacity}")
        self.capacity = capacity
        self.batch_size_B = batch_size_B
        self.rng = np.random.default_rng(seed)
        self.episodes: OrderedDict[str, _Stored] = OrderedDict()  # oldest first
        self._ids: dict[int, str] = {}  # episode serial -> id
        self._serials = 0
        self._num_timesteps = 0
        self._num_timesteps_added = 0
        self._num_episodes_evicted = 0
        self.sampled_timesteps = 0
        self._columns: dict[str, Any] = {}  # name -> (nested) array, a row per step
        self._rows = 0  # rows allocated in the arrays
        self._free: list[np.ndarray] = []  # rows free for reuse
        self._high = 0  # rows ever used (rows past it are free too)
        self._occupied_cache: np.ndarray | None = None
        self._last_sampled_rows = np.zeros(0, np.int64)

    # --- RLlib's accounting ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_timesteps

    def get_num_timesteps(self) -> int:
        """Env steps stored now."""
        return self._num_timesteps

    def get_added_timesteps(self) -> int:
        """Env steps ever added."""
        return self._num_timesteps_added

    def get_num_episodes(self) -> int:
        return len(self.episodes)

    def get_num_episodes_evicted(self) -> int:
        return self._num_episodes_evicted

    def get_sampled_timesteps(self) -> int:
        """Transitions ever sampled."""
        return self.sampled_timesteps

    # --- adding -----------------------------------------------------------------------------------------

    def add(self, episodes: SingleAgentEpisode | list[SingleAgentEpisode]) -> None:
        """Store episodes (chunks): a chunk of an episode stored already is joined onto it; then the oldest
        episodes are evicted while more than `capacity` env steps are stored (never the last one)."""
        for episode in episodes if isinstance(episodes, list) else [episodes]:
            self._add_one(episode)
            while self._num_timesteps > self.capacity and len(self.episodes) > 1:
                self._evict_oldest()

    def _add_one(self, episode: SingleAgentEpisode) -> None:
        n = len(episode)
        stored = self.episodes.get(episode.id_)
        continues = stored is not None and not stored.done and stored.t == episode.t_started and stored.rows
        if not n:
            if continues:  # an empty chunk that only says how its episode ended
                assert stored is not None  # continues
                self._end(stored, episode)
            return
        columns = {
            Columns.OBS: _items(episode.get_observations(slice(0, n))),
            Columns.NEXT_OBS: _items(episode.get_observations(slice(1, n + 1))),
            Columns.ACTIONS: _items(episode.get_actions(slice(0, n))),
            Columns.REWARDS: np.asarray(_items(episode.get_rewards(slice(0, n))), np.float32),
            **{key: _items(episode.get_extra_model_outputs(key, slice(0, n))) for key in episode.extra_model_outputs},
        }
        if not self._columns:
            self._create_columns(columns)
        missing = {name for name in self._columns if not name.startswith("_")} - set(columns)
        if missing:
            raise ValueError(f"episode {episode.id_} has no {', '.join(sorted(missing))}, which the buffer holds")
        if stored is None:
            stored = self._new_episode(episode.id_, episode.t_started)
        rows = self._allocate(n)
        for name, data in columns.items():
            if name in self._columns:
                map_structure(lambda store, new: store.__setitem__(rows, new), self._columns[name], data)
        self._columns["_next"][rows[:-1]] = rows[1:]
        self._columns["_next"][rows[-1]] = -1
        self._columns["_t"][rows] = np.arange(episode.t_started, episode.t_started + n)
        self._columns["_serial"][rows] = stored.serial
        self._columns["_terminated"][rows] = False
        self._columns["_truncated"][rows] = False
        if continues:
            self._columns["_next"][stored.last_row] = rows[0]
        stored.rows.append(rows)
        stored.length += n
        stored.t = episode.t_started + n
        self._num_timesteps += n
        self._num_timesteps_added += n
        self._on_added(rows)
        self._end(stored, episode)

    def _new_episode(self, episode_id: str, t_started: int) -> _Stored:
        self._serials += 1
        stored = _Stored(self._serials, t=t_started)
        self.episodes[episode_id] = stored
        self._ids[stored.serial] = episode_id
        return stored

    def _end(self, stored: _Stored, episode: SingleAgentEpisode) -> None:
        """Mark the stored episode's last step terminated or truncated, as the chunk says."""
        if episode.is_done and stored.rows:
            stored.done = True
            self._columns["_terminated"][stored.last_row] = episode.is_terminated
            self._columns["_truncated"][stored.last_row] = episode.is_truncated and not episode.is_terminated

    def _create_columns(self, columns: dict[str, Any]) -> None:
        capacity = max(self.capacity + 1, 16)
        for name, data in columns.items():
            self._columns[name] = map_structure(lambda leaf: np.zeros((capacity, *leaf.shape[1:]), leaf.dtype), data)
        self._columns["_next"] = np.full(capacity, -1, np.int64)
        self._columns["_t"] = np.zeros(capacity, np.int64)
        self._columns["_serial"] = np.zeros(capacity, np.int64)
        self._columns["_terminated"] = np.zeros(capacity, bool)
        self._columns["_truncated"] = np.zeros(capacity, bool)
        self._rows = capacity

    def _allocate(self, n: int) -> np.ndarray:
        """`n` free rows: freed ones first, then fresh ones (the arrays grow when none are left)."""
        taken: list[np.ndarray] = []
        need = n
        while need and self._free:
            block = self._free.pop()
            taken.append(block[:need])
            if len(block) > need:
                self._free.append(block[need:])
            need -= len(taken[-1])
        if need:
            if self._high + need > self._rows:
                self._grow(self._high + need)
            taken.append(np.arange(self._high, self._high + need))
            self._high += need
        return np.concatenate(taken) if len(taken) > 1 else taken[0]

    def _grow(self, rows: int) -> None:
        """Room for at least `rows` rows (an episode longer than the capacity, kept whole)."""
        new = max(rows, 2 * self._rows)

        def grown(array: np.ndarray) -> np.ndarray:
            bigger = np.zeros((new, *array.shape[1:]), array.dtype)
            bigger[: self._rows] = array
            return bigger

        self._columns = {name: map_structure(grown, column) for name, column in self._columns.items()}
        self._columns["_next"][self._rows :] = -1
        self._rows = new
        self._on_grown(new)

    def _evict_oldest(self) -> None:
        _, stored = self.episodes.popitem(last=False)
        del self._ids[stored.serial]
        rows = np.concatenate(stored.rows)
        self._free.append(rows)
        self._num_timesteps -= stored.length
        self._num_episodes_evicted += 1
        self._on_evicted(rows)

    def _on_added(self, rows: np.ndarray) -> None:
        """Rows just filled (prioritized replay gives them the highest priority)."""
        self._occupied_cache = None

    def _on_evicted(self, rows: np.ndarray) -> None:
        """Rows just freed."""
        self._occupied_cache = None

    def _on_grown(self, rows: int) -> None:
        """The arrays now have `rows` rows."""

    def _occupied(self) -> np.ndarray:
        """The rows that hold a stored step, in row order."""
        if self._occupied_cache is None:
            free = np.zeros(max(self._rows, 1), bool)
            free[self._high :] = True
            for block in self._free:
                free[block] = True
            self._occupied_cache = np.flatnonzero(~free)
        return self._occupied_cache

    # --- sampling ----------------------------------------------------------------------------------------

    def sample(
        self,
        num_items: int | None = None,
        *,
        batch_size_B: int | None = None,
        n_step: NStep = 1,
        gamma: float = 0.99,
        include_extra_model_outputs: bool = False,
        **kwargs: Any,
    ) -> list[SingleAgentEpisode]:
        """`num_items` transitions as one-step episodes (RLlib's `sample(..., sample_episodes=True)`): the
        observation and the one n steps later, the first action, the discounted reward sum, the done flags of
        the step reached, and `n_step` and `weights` (plus, with `include_extra_model_outputs`, the first step's
        model outputs) as extra model outputs."""
        batch = self.sample_transitions(
            num_items,
            batch_size_B=batch_size_B,
            n_step=n_step,
            gamma=gamma,
            include_extra_model_outputs=include_extra_model_outputs,
            **kwargs,
        )
        return [self._one_step_episode(batch, i) for i in range(len(batch[Columns.REWARDS]))]

    def sample_transitions(
        self,
        num_items: int | None = None,
        *,
        batch_size_B: int | None = None,
        n_step: NStep = 1,
        gamma: float = 0.99,
        include_extra_model_outputs: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The transitions `sample` returns, as batch columns ([B, ...] arrays, by Columns name): OBS, NEXT_OBS,
        ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS, `n_step` and `weights`, with the first step's model outputs
        if asked. What the learner pipeline's pieces make of `sample`'s episodes, made at once."""
        size = num_items or batch_size_B or self.batch_size_B
        if not self._num_timesteps:
            raise ValueError("the replay buffer is empty: add episodes before sampling")
        rows, weights = self._draw(size, **kwargs)
        self._last_sampled_rows = rows
        self.sampled_timesteps += size
        low, high = (n_step, n_step) if isinstance(n_step, int) else n_step
        if not 1 <= low <= high:
            raise ValueError(f"n_step must be at least 1 (a range: low <= high), got {n_step}")
        wanted = np.full(size, low) if low == high else self.rng.integers(low, high + 1, size)
        columns = self._columns
        following, terminated = columns["_next"], columns["_terminated"]
        rewards, done = columns[Columns.REWARDS], columns["_terminated"] | columns["_truncated"]
        last, current = rows.copy(), rows.copy()
        total = np.zeros(size, np.float64)
        discount = np.ones(size, np.float64)
        spans = np.zeros(size, np.int64)
        going = np.ones(size, bool)
        for k in range(high):
            going &= wanted > k
            total[going] += discount[going] * rewards[current[going]]
            discount[going] *= gamma
            spans[going] += 1
            last[going] = current[going]
            going &= ~done[current] & (following[current] >= 0)
            if not going.any():
                break
            current = np.where(going, following[current], current)
        batch = {
            Columns.OBS: _gather(columns[Columns.OBS], rows),
            Columns.ACTIONS: _gather(columns[Columns.ACTIONS], rows),
            Columns.REWARDS: total.astype(np.float32),
            Columns.NEXT_OBS: _gather(columns[Columns.NEXT_OBS], last),
            Columns.TERMINATEDS: terminated[last],
            Columns.TRUNCATEDS: columns["_truncated"][last],
            N_STEP: spans,
            WEIGHTS: weights,
        }
        if include_extra_model_outputs:
            for name in self._extra_outputs():
                batch[name] = _gather(columns[name], rows)
        return batch

    def _draw(self, size: int, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """`size` rows drawn uniformly over the stored steps, and their importance weights (all 1)."""
        occupied = self._occupied()
        return occupied[self.rng.integers(len(occupied), size=size)], np.ones(size, np.float32)

    def _extra_outputs(self) -> list[str]:
        fixed = {Columns.OBS, Columns.NEXT_OBS, Columns.ACTIONS, Columns.REWARDS}
        return [name for name in self._columns if name not in fixed and not name.startswith("_")]

    def _one_step_episode(self, batch: dict[str, Any], i: int) -> SingleAgentEpisode:
        row = int(self._last_sampled_rows[i])

        def item(column: Any) -> Any:
            return map_structure(lambda leaf: leaf[i], column)

        outputs = {name: [item(batch[name])] for name in (*self._extra_outputs(), N_STEP, WEIGHTS) if name in batch}
        return SingleAgentEpisode(
            self._ids[int(self._columns["_serial"][row])],
            observations=[item(batch[Columns.OBS]), item(batch[Columns.NEXT_OBS])],
            actions=[item(batch[Columns.ACTIONS])],
            rewards=[float(batch[Columns.REWARDS][i])],
            terminated=bool(batch[Columns.TERMINATEDS][i]),
            truncated=bool(batch[Columns.TRUNCATEDS][i]),
            extra_model_outputs=outputs,
            t_started=int(self._columns["_t"][row]),
            len_lookback_buffer=0,
        )

    def _stored_rows(self) -> np.ndarray:
        """The rows of the stored steps, oldest episode first, each episode's in order."""
        blocks = [rows for stored in self.episodes.values() for rows in stored.rows]
        return np.concatenate(blocks) if blocks else np.zeros(0, np.int64)

    # --- state (checkpoints) -----------------------------------------------------------------------------

    def get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The stored steps as arrays (by flat column name) and the rest as plain JSON-able data."""
        rows = self._stored_rows()
        arrays = {
            f"{name}/{i}": leaf[rows]
            for name, column in self._columns.items()
            for i, leaf in enumerate(flatten(column))
        }
        meta = {
            "episodes": [[episode_id, s.length, s.t, s.done] for episode_id, s in self.episodes.items()],
            "structure": {name: _structure(column) for name, column in self._columns.items()},
            "counters": [self._num_timesteps_added, self._num_episodes_evicted, self.sampled_timesteps],
        }
        return arrays, meta

    def set_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Restore what `get_state` returned into this empty buffer (of any capacity: the oldest episodes are
        evicted if it holds less)."""
        if self._num_timesteps or self.episodes:
            raise ValueError("set_state needs an empty replay buffer")
        saved = {
            name: _restructure(structure, [arrays[f"{name}/{i}"] for i in range(_leaves(structure))])
            for name, structure in meta["structure"].items()
        }
        start = 0
        for episode_id, length, t, done in meta["episodes"]:
            stored = self._new_episode(episode_id, t)
            stored.done = done
            if not length:
                continue
            if not self._columns:
                self._create_columns({name: column for name, column in saved.items() if not name.startswith("_")})
            rows = self._allocate(length)
            steps = slice(start, start + length)
            for name, column in saved.items():
                map_structure(
                    lambda store, data, rows=rows, steps=steps: store.__setitem__(rows, data[steps]),
                    self._columns[name],
                    column,
                )
            # Saved links are rows of the saved buffer: within an episode, a step links to the next unless at a gap.
            linked = saved["_next"][steps] >= 0
            self._columns["_next"][rows] = np.append(np.where(linked[:-1], rows[1:], -1), -1)
            self._columns["_serial"][rows] = stored.serial
            stored.rows.append(rows)
            stored.length = length
            self._num_timesteps += length
            start += length
            self._on_added(rows)
        self._num_timesteps_added, self._num_episodes_evicted, self.sampled_timesteps = meta["counters"]
        while self._num_timesteps > self.capacity and len(self.episodes) > 1:
            self._evict_oldest()


def _items(data: Any) -> Any:
    """An episode getter's result as arrays with a leading step axis (a list-mode episode gives a list)."""
    return stack_items(data) if isinstance(data, list) else map_structure(np.asarray, data)


def _gather(column: Any, rows: np.ndarray) -> Any:
    return map_structure(lambda leaf: leaf[rows], column)


def _structure(column: Any) -> Any:
    """A column's nesting, JSON-able: dicts of structures, lists for tuples, None for a leaf."""
    if isinstance(column, dict):
        return {key: _structure(value) for key, value in column.items()}
    if isinstance(column, tuple):
        return [_structure(value) for value in column]
    return None


def _leaves(structure: Any) -> int:
    if isinstance(structure, dict):
        return sum(_leaves(v) for v in structure.values())
    if isinstance(structure, list):
        return sum(_leaves(v) for v in structure)
    return 1


def _restructure(structure: Any, leaves: list[np.ndarray]) -> Any:
    """The column of `structure` with these leaves, in `flatten`'s order."""
    it = iter(leaves)

    def build(s: Any) -> Any:
        if isinstance(s, dict):
            return {key: build(value) for key, value in s.items()}
        if isinstance(s, list):
            return tuple(build(value) for value in s)
        return next(it)

    return build(structure)
