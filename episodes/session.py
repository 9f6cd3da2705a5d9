"""One client stream: N sub-env episodes, stored column-wise, fed one step message at a time.

A step message carries, for every sub-env, the observation that followed the previous action (or a
reset observation for a sub-env whose episode had ended, as gymnasium's NEXT_STEP autoreset does).
`observe` writes it into the session's `StepTable` as one row (one array write per column, whatever
the number of sub-envs), the batcher computes actions for all rows, and `record` writes those actions
and extra model outputs into the same row. Per sub-env the session keeps only where its episode starts
in the table. Episodes that ended, and long ones cut every `rollout_fragment_length` steps, come out of
`record` (after the forward, so connector write-backs such as MeanStdFilter's are in them) as chunks
copied straight from the table (`episodes.codec.ChunkColumns`), holding exactly the `SingleAgentEpisode`s RLlib's
`add_env_step` and `cut` would have built; per-row Python work happens only then, once per shipped chunk,
not once per env step.

The inference server keeps one per client stream; a local-inference env client keeps one for its own sub-envs
and records its episodes exactly as a server would (`client/local.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.columns import RECORDED_OUTPUTS, Columns
from rlgate.core.spaces import has_form_of
from rlgate.core.tree import map_structure, unbatch
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.chunk_codec import ChunkColumns
from rlgate.episodes.rows import EpisodeRows
from rlgate.episodes.step_table import StepTable


@dataclass(frozen=True)
class SessionSpec:
    """What a client declared in its hello."""

    client_id: str
    observation_space: gym.Space
    action_space: gym.Space
    num_envs: int
    explore: bool


class Session:
    """The episodes of one client stream and the actions they are waiting on.

    Per sub-env i, its running episode (if `live[i]`) has its first observation at table row
    `start[i]` and a lookback reaching back to row `lookback_start[i]`; its latest observation is at
    the newest row. An episode's step k (0-based, after the lookback) is: observation row start + k,
    action and outputs row start + k, reward row start + k + 1. Done flags are only read at the newest row,
    so the table does not keep them.
    """

    def __init__(
        self,
        spec: SessionSpec,
        *,
        rollout_fragment_length: int | None,
        lookback: int,
        ships: bool = True,
        observation_spaces: Sequence[gym.Space | None] = (),
    ) -> None:
        """`rollout_fragment_length`: cut running episodes every this many steps; None: never (whole episodes).
        `ships=False` (nothing takes this session's chunks: no episode files, and no learner or a greedy
        session): the cuts are made but no chunk is built, since building one costs more than the step that
        fills it. `observation_spaces`: the spaces the env-to-module pieces leave observations in (each piece's
        output), for what a piece written RLlib's way writes into an episode without saying its space."""
        self.id = uuid.uuid4().hex
        self.spec = spec
        self.observation_space: gym.Space | None = spec.observation_space  # what episodes hold: changed by write-backs
        self._observation_spaces = observation_spaces
        self._fragment = rollout_fragment_length or np.iinfo(np.int64).max // 4
        self._lookback = lookback
        self._ships = ships
        self._table = StepTable(spec.num_envs)
        n = spec.num_envs
        self._live = np.zeros(n, bool)
        self._parked = np.zeros(n, bool)  # running an episode begun after move(): never shipped
        self.moving = False
        self._done = np.zeros(n, bool)
        self._terminateds = self._truncateds = self._done  # the newest message's flags
        self._start = np.zeros(n, np.int64)
        self._lookback_start = np.zeros(n, np.int64)
        self._t_started = np.zeros(n, np.int64)
        self._chunk_index = np.zeros(n, np.int64)
        self._ids: list[str] = [""] * n
        self._new_ids = count()
        self._row = -1  # the newest row
        # Cheap per-message checks (numpy calls cost ~1 us each, as much as a one-env message's real work).
        self._any_done = False  # some sub-env's episode ended at the newest row
        self._first_start = 0  # the smallest start: no cut is due before row first_start + fragment
        self._pending: _Step | None = None  # the newest row while its actions are being computed
        self._unshipped: int | None = None  # unshipped_steps(), until a step, a cut or the end changes it

    def move(self) -> None:
        """Hand the session over at its sub-envs' episode boundaries: every episode that begins from now on (with
        the reset observations of the step about to be observed) is parked: acted on, never recorded; the client
        starts afresh elsewhere once `settled()`."""
        self.moving = True

    def settled(self) -> bool:
        """Moving, and every recorded episode has ended: the client may leave without cutting one."""
        return self.moving and not (self._live & ~self._parked).any()

    def resets_only(self) -> bool:
        """True when no sub-env has a running episode: the next step's rows all carry reset observations."""
        return not self._live.any()

    def observe(
        self,
        obs: Any,
        rewards: np.ndarray,
        terminateds: np.ndarray,
        truncateds: np.ndarray,
        infos: list[dict] | None,
    ) -> tuple[EpisodeRows, int]:
        """Append one step of every sub-env.

        Returns the episodes, row by row, that the next actions are for, and how many env steps
        (transitions, not reset observations) were appended.
        """
        if self._pending is not None:
            raise RuntimeError("observe() twice: record() the previous step's outputs first")
        live, table = self._live, self._table
        if table.full:
            table.make_room(keep_from=int(self._lookback_start[live].min()) if live.any() else self._row + 1)
        t = self._row = table.new_row()
        table.put(Columns.REWARDS, t, rewards.astype(np.float32, copy=False))
        table.infos[-1] = infos
        self._terminateds, self._truncateds = terminateds, truncateds  # only the newest row's are ever read
        self._done = terminateds | truncateds
        if live.all():
            fresh = _NONE
        else:  # sub-envs whose episode starts with this (reset) observation
            fresh = np.flatnonzero(~live)
            for i in fresh:
                self._ids[i] = f"{self.id}-{next(self._new_ids)}"
            self._t_started[fresh] = self._chunk_index[fresh] = 0
            self._start[fresh] = self._lookback_start[fresh] = t
            self._first_start = int(self._start.min())
            self._done[fresh] = False
            live[fresh] = True
            self._parked[fresh] = self.moving
        self._any_done = bool(self._done.any())
        self._pending = _Step(self, t, obs)
        self._unshipped = None
        steps = len(live) - fresh.size
        return EpisodeRows([self._pending]), steps

    def record(self, outputs: dict[str, Any]) -> list[Chunk]:
        """Keep this step's actions and outputs (rows = sub-envs); return the chunks now due for shipping."""
        step, self._pending = self._pending, None
        if step is None:
            raise RuntimeError("record() without observe()")
        self._unshipped = None
        t = step.row
        self._table.put(Columns.OBS, t, step.latest_observations())
        self._table.put(Columns.ACTIONS, t, outputs[Columns.ACTIONS])
        for key in RECORDED_OUTPUTS:
            if key in outputs:
                self._table.put(key, t, outputs[key])
        shipped = self._take_done()
        if t - self._fragment >= self._first_start:
            shipped += self._cut(self._start <= t - self._fragment, t)
        return shipped

    def flush(self) -> list[Chunk]:
        """Ship every step recorded so far: ended episodes, and running ones cut now (their successors go on).

        A step still waiting for its actions (observed, not recorded) is left for `record()`: the
        env-to-module pipeline has not run on its observations yet (MeanStdFilter, FlattenObservations
        rewrite them), so the cut is one row earlier and episodes that ended in that step ship with it.
        """
        end = self._recorded_row()
        done = self._take_done() if end == self._row else []
        self._unshipped = None
        return done + self._cut(self._start < end, end)

    def unshipped_steps(self) -> int:
        """Env steps recorded in running episodes and not shipped yet (what `flush()` would ship).

        Kept until the session changes: a server with a learner asks every session before every batch."""
        if self._unshipped is None:
            recorded = self._live & ~self._parked
            self._unshipped = int((self._recorded_row() - self._start)[recorded].clip(min=0).sum())
        return self._unshipped

    def close(self) -> list[Chunk]:
        """End the session: ended episodes not yet shipped, and every running one with at least one recorded
        step cut off as truncated (and `session_closed`: the env did not end it). A step still waiting for its
        actions is dropped: it was never answered, and its observations never went through the env-to-module
        pipeline."""
        end = self._recorded_row()
        done = self._take_done() if end == self._row else []
        running = self._live & ~self._parked & (end > self._start)
        unfinished = self._chunks(np.flatnonzero(running), end, truncated=True, session_closed=True)
        self._live[:] = False
        self._unshipped = None
        return done + unfinished

    def _recorded_row(self) -> int:
        """The newest row whose actions are recorded (the one before the newest while a step is pending)."""
        return self._row if self._pending is None else self._row - 1

    def _take_done(self) -> list[Chunk]:
        """Ended episodes leave their slot (the sub-env's next observation starts a new one)."""
        if not self._any_done:
            return []
        self._any_done = False
        done = np.flatnonzero(self._done & self._live)
        self._live[done] = False
        return self._chunks(done, self._row)

    def _cut(self, due: np.ndarray, end: int) -> list[Chunk]:
        """Ship the running episodes among `due` up to row `end`; each goes on as the next chunk from there.

        Episodes that ended at the newest row are no longer running once `_take_done()` took them; while
        that row is pending they still are, and their successor chunk holds the final step."""
        rows = np.flatnonzero(due & self._live)
        if not rows.size:
            return []
        chunks = self._chunks(rows, end)
        self._t_started[rows] += end - self._start[rows]
        self._chunk_index[rows] += 1
        self._start[rows] = end
        self._first_start = int(self._start.min())
        self._lookback_start[rows] = np.maximum(end - self._lookback, self._lookback_start[rows])
        return chunks

    def _chunks(
        self, rows: np.ndarray, end: int, *, truncated: bool = False, session_closed: bool = False
    ) -> list[Chunk]:
        """These sub-envs' running episodes up to row `end`, as chunks to ship; none when nothing takes them."""
        if not self._ships:
            return []
        if self.moving:
            rows = rows[~self._parked[rows]]
        return [self._chunk(int(i), end, truncated=truncated, session_closed=session_closed) for i in rows]

    def _chunk(self, i: int, end: int, *, truncated: bool = False, session_closed: bool = False) -> Chunk:
        """Sub-env i's running episode up to recorded row `end`, its columns copied straight from the table.

        The columns `episode_columns` would take of the chunk as a `SingleAgentEpisode`, for less: the table
        holds the columns' rows consistent, so there is nothing to check. A shipped chunk has a step
        (`start < end`), and every row up to `end` is recorded (none of its steps is pending)."""
        table = self._table
        first, start = int(self._lookback_start[i]), int(self._start[i])
        terminated, truncated = self._ends(i, end, truncated)
        columns = ChunkColumns(
            self._ids[i],
            observations=table.get(Columns.OBS, first, end + 1, i),
            actions=table.get(Columns.ACTIONS, first, end, i),
            rewards=table.get(Columns.REWARDS, first + 1, end + 1, i),
            extra_model_outputs={key: table.get(key, first, end, i) for key in RECORDED_OUTPUTS if key in table},
            infos=table.get_infos(first, end + 1, i),
            len_lookback_buffer=start - first,
            terminated=terminated,
            truncated=truncated,
            t_started=int(self._t_started[i]),
            chunk_index=int(self._chunk_index[i]),
            session_closed=session_closed,
        )
        return Chunk(columns, self.observation_space, self.spec.action_space)

    def _episode(self, i: int) -> SingleAgentEpisode:
        """Sub-env i's running episode up to the pending step, as a SingleAgentEpisode, for per-episode
        connector pieces: with the pending step's observation as it is now (not in the table until record()).

        In list mode, as RLlib's env runners hold a running episode: a piece may write an observation of
        another shape (or structure) over the latest one, which a numpy'd episode refuses."""
        t, table, pending = self._row, self._table, self._pending
        assert pending is not None  # asked for by connector pieces while a step is pending
        first, start = int(self._lookback_start[i]), int(self._start[i])
        stepped = first < t  # the episode has steps (actions, outputs) before the pending one

        def rows(key: str, stop: int) -> list:
            return unbatch(table.get(key, first, stop, i)) if first < stop else []

        terminated, truncated = self._ends(i, t, False)
        episode = SingleAgentEpisode(
            self._ids[i],
            observations=[*rows(Columns.OBS, t), pending.latest_observation(i)],
            observation_space=self.observation_space,
            infos=table.get_infos(first, t + 1, i),
            actions=rows(Columns.ACTIONS, t),
            action_space=self.spec.action_space,
            rewards=table.get(Columns.REWARDS, first + 1, t + 1, i).tolist(),
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs={k: rows(k, t) for k in RECORDED_OUTPUTS if k in table and stepped},
            t_started=int(self._t_started[i]),
            len_lookback_buffer=start - first,
        )
        episode.chunk_index = int(self._chunk_index[i])
        return episode

    def space_holding(self, observation: Any, said: gym.Space | None) -> gym.Space | None:
        """The space of an observation a per-episode piece wrote into a built episode: the episode's if the piece
        set it (`said`), else the session's while it has that form, else the first piece output space that has
        it (RLlib's pieces rewrite observations without touching the episode's space)."""
        if said is not self.observation_space:
            return said
        if self.observation_space is not None and has_form_of(self.observation_space, observation):
            return self.observation_space
        spaces = self._observation_spaces
        return next((space for space in spaces if space is not None and has_form_of(space, observation)), said)

    def _ends(self, i: int, end: int, truncated: bool) -> tuple[bool, bool]:
        """(terminated, truncated) of sub-env i's chunk up to row `end`: its flags if it ended at the newest row."""
        done = end == self._row and bool(self._done[i])
        return done and bool(self._terminateds[i]), truncated or (done and bool(self._truncateds[i]))


class _Step:
    """The newest row of a session while its actions are computed: the rows' block in `EpisodeRows`."""

    def __init__(self, session: Session, row: int, observations: Any) -> None:
        self.session = session
        self.row = row
        self._latest = observations
        self._episodes: dict[int, SingleAgentEpisode] = {}

    def __len__(self) -> int:
        return self.session.spec.num_envs

    def episode(self, i: int) -> SingleAgentEpisode:
        """Row i's episode, built once per step (only per-episode connector pieces ask for it)."""
        episode = self._episodes.get(i)
        if episode is None:
            episode = self._episodes[i] = self.session._episode(i)
        return episode

    def set_latest_observations(self, observations: Any, observation_space: gym.Space | None) -> None:
        self._latest = observations
        self.session.observation_space = observation_space
        self._episodes.clear()  # built before the write-back: rebuilt from the new observations if asked again

    def latest_observation(self, i: int) -> Any:
        episode = self._episodes.get(i)
        if episode is not None:  # a per-episode piece may have written it there
            return episode.get_observations(-1)
        return map_structure(lambda x: x[i], self._latest)

    def latest_observations(self) -> Any:
        """All rows' latest observations ([N, ...]), with what per-episode pieces wrote into built episodes (and
        the session's observation space then theirs)."""
        if not self._episodes:
            return self._latest
        rows = [self.latest_observation(i) for i in range(len(self))]
        episode = next(iter(self._episodes.values()))
        self.session.observation_space = self.session.space_holding(rows[0], episode.observation_space)
        return map_structure(lambda *items: np.stack(items), *rows)


_NONE = np.zeros(0, np.int64)
