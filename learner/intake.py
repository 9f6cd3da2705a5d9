"""Episode intake: chunks from every server, de-duplicated, kept on disk until a checkpoint holds them.

A batch is acknowledged only after it is written to `intake_dir`, and its file is deleted only after a
checkpoint includes the updates that trained on all its chunks. A learner killed at any moment therefore
restarts from its last checkpoint, reloads the chunks trained since (or never trained) from the intake
files, and recognises every re-sent chunk by (episode id, chunk index): each step is trained on exactly
once. An update takes exactly `train_batch_size` steps, oldest chunks first, splitting the last one; how
far a split chunk was taken goes into checkpoints too, so a restart trains only its remainder.
A learner that does not resume (a fresh model) sets an earlier run's intake files aside, unread: their
actions came from another model, whose version numbers mean nothing to the new one.

Nothing that could poison training gets in: the learner's service decodes every batch (`batch_decoder`), which
refuses a chunk that does not decode, holds a non-finite reward, model output (logp, value, distribution inputs) or
observation (unless the run spec's env allows them: `env.allow_nonfinite_obs`), or does not fit the run's spaces
and model (`chunk_check`); the intake counts each refusal by reason and logs it, and takes the rest of the batch.
A batch whose decoding or sorting raises anything else (a bug, or a user's space or code failing on an odd batch)
is refused whole ("unreadable batch"), acknowledged all the same: a server would re-send a batch that ended its
stream for ever. Its chunks are sorted before any of them is recorded, so such a batch leaves nothing behind. An
intake file that fails so when read back at start-up was taken once: it is renamed aside (`*.unreadable`), kept,
not refused.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.batch_decoder import BatchDecoder, DecodedBatch, chunk_key
from rlgate.learner.multi_agent_returns import EpisodeReturns, MultiAgentReturns
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

RETURN_WINDOW = 20
# Single-agent episodes with chunks in and their end to come, at most (an id and three numbers each, ~250 bytes:
# 25 MB in all): far more than the sub-envs a learner's servers run at once, since only an episode whose client
# left after a cut, or whose server crashed, never ends. Beyond it, the one that waited longest for its next chunk
# is forgotten, and never counted in returns (RLlib counts no unfinished episode either).
MAX_RUNNING = 100_000


@dataclass(frozen=True)
class Covered:
    """What a checkpoint written now covers: the chunks trained (every step of them taken by an update), those
    dropped as too stale to train, how many steps of each split chunk were trained (its head: its rest waits, or
    was dropped as stale), and the intake files it makes redundant (every chunk in them trained or dropped). The
    env steps trained are the trained chunks' steps plus the partial ones."""

    trained: list[str]
    stale: list[str]
    partial: dict[str, int]
    files: list[Path]


@dataclass
class _File:
    path: Path
    keys: list[str]


@dataclass
class _Sorted:
    """A batch's chunks, sorted before any of them is recorded: new ones to take (each with its steps and newest
    model version), refusals (reason, chunks, what, the error behind it), and how many were duplicates."""

    taken: dict[str, tuple[SingleAgentEpisode, int, int]] = field(default_factory=dict)  # by key, in batch order
    refused: list[tuple[str, int, str, BaseException | None]] = field(default_factory=list)
    duplicates: int = 0


@dataclass
class Intake:
    """Pending chunks, the keys already seen, and episode returns for progress reporting.

    It takes batches decoded by `decoder` (the learner's service decodes what it receives with the same one), and
    decodes its own files with it at start-up. Multi-agent: `count` counts chunks' steps (env or agent steps;
    default: their length) and chunks are taken whole (`split_chunks=False`), since an agent chunk's share of env
    steps cannot be split.
    """

    directory: Path
    decoder: BatchDecoder
    trained: set[str] = field(default_factory=set)  # keys in the last checkpoint
    stale: set[str] = field(default_factory=set)  # keys dropped as stale in the last checkpoint
    partial: dict[str, int] = field(default_factory=dict)  # key -> steps of that chunk trained, last checkpoint
    pending: deque[SingleAgentEpisode] = field(default_factory=deque)  # oldest first
    pending_steps: int = 0
    episodes_finished: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # chunks refused, by reason
    # Multi-agent, as RLlib's episode_return_mean and episode_len_mean: per multi-agent episode, the sum of its
    # agents' returns and its env steps (`multi_agent_returns`).
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    # Multi-agent: each module's window of its agents' returns summed per episode (RLlib's
    # module_episode_returns_mean), which tells a trained module from its opponent where the return of a
    # zero-sum game reads 0; and each agent's (agent_episode_returns_mean).
    module_returns: dict[str, deque[float]] = field(default_factory=dict)
    agent_returns: dict[str, deque[float]] = field(default_factory=dict)
    finished: list[tuple[float, int]] = field(default_factory=list)  # (return, length) not yet take_finished()
    resume: bool = True  # reload the intake files found in `directory`; False: set them aside
    lookback: int = 1  # steps of lookback the remainder of a split chunk keeps (the servers' lookback horizon)
    on_reject: Callable[[str, int], None] = lambda reason, chunks: None  # told of every rejection
    count: Callable[[list[SingleAgentEpisode]], int] = field(default=lambda episodes: sum(map(len, episodes)))
    split_chunks: bool = True  # False (multi-agent): chunks are taken whole; their env steps count per chunk
    max_running: int = MAX_RUNNING  # single-agent episodes whose returns are summed while they run, at most

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            _set_aside(self.directory)
        self._seen = self.trained | self.stale
        self._finished: set[str] = set()  # keys taken whole since the last checkpoint
        self._dropped: set[str] = set()  # keys dropped as stale since the last checkpoint
        self._taken = dict(self.partial)  # key -> steps of a split chunk taken so far
        self._files: list[_File] = []
        # Episode id -> return, length and number of its chunks so far, least recently added to first.
        self._running: dict[str, tuple[float, int, int]] = {}
        self._multi_agent = MultiAgentReturns()  # multi-agent episodes' chunks so far
        # At most the newest version of every pending chunk: while it is not below the floor, no chunk is stale
        # and drop_stale() scans nothing (it runs on every intake change, and a backlog can be long).
        self._version_floor = np.iinfo(np.int64).max
        for path in sorted(self.directory.glob("*.pb"), key=lambda p: p.stat().st_mtime):
            payload = path.read_bytes()
            try:
                batch = learner_pb2.EpisodeBatch.FromString(payload)
            except DecodeError as exc:
                _set_unreadable_aside(path, f"does not decode as an EpisodeBatch ({exc})")
                continue
            # A batch this learner took once, that its code (or a user's space) now fails on: kept on disk.
            try:
                sorted_ = self._sort(self.decoder.decode(batch, payload))
                unreadable = next((error for *_, error in sorted_.refused if error is not None), None)
            except Exception as exc:
                unreadable = exc
            if unreadable is not None:
                _set_unreadable_aside(path, f"cannot be read back ({unreadable!r})")
                continue
            self._files.append(_File(path, self._record(sorted_)))
        if self._files:
            log.info("resumed intake files=%d pending_steps=%d", len(self._files), self.pending_steps)

    def accept(self, batch: DecodedBatch) -> learner_pb2.EpisodeAck:
        """Take a decoded batch: store its new chunks durably (the bytes it came in), then acknowledge it."""
        duplicates, rejected = self.duplicates, self.rejected.total()
        accepted = self._add(batch)
        if accepted:
            path = self.directory / f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.pb"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(batch.payload)
            tmp.replace(path)
            self._files.append(_File(path, accepted))
        return learner_pb2.EpisodeAck(
            seq=batch.seq,
            accepted=len(accepted),
            duplicates=self.duplicates - duplicates,
            rejected=self.rejected.total() - rejected,
        )

    def drop_stale(self, min_version: int | Mapping[str, int]) -> int:
        """Drop pending chunks all of whose actions came from versions older than `min_version` (multi-agent:
        one per module id, each chunk held to its module's); their steps."""

        def is_stale(chunk: SingleAgentEpisode) -> bool:
            if isinstance(min_version, int):
                return _newest_version(chunk) < min_version
            assert chunk.module_id is not None  # a multi-agent chunk names its module
            floor = min_version[chunk.module_id]
            return _newest_version(chunk) < floor

        highest = min_version if isinstance(min_version, int) else max(min_version.values(), default=0)
        if self._version_floor >= highest:
            return 0
        stale = [chunk for chunk in self.pending if is_stale(chunk)]
        if stale:
            self.pending = deque(chunk for chunk in self.pending if not is_stale(chunk))
            # A split chunk's rest among them keeps its head's steps in `_taken`: those were trained.
            self._dropped.update(chunk_key(chunk.id_, chunk.chunk_index) for chunk in stale)
        self._version_floor = min(map(_newest_version, self.pending), default=np.iinfo(np.int64).max)
        steps = self.count(stale)
        self.pending_steps -= steps
        return steps

    def take(self, steps: int) -> list[SingleAgentEpisode]:
        """Exactly `steps` env steps (or all there are) for one update, oldest chunks first; the last one is
        split if it is longer than needed, and its remainder stays first in line."""
        batch, taken = [], 0
        while taken < steps and self.pending:
            chunk = self.pending.popleft()
            key = chunk_key(chunk.id_, chunk.chunk_index)
            need = steps - taken
            if self.split_chunks and len(chunk) > need:
                rest = chunk.slice(slice(need, None), len_lookback_buffer=self.lookback)
                self.pending.appendleft(rest)
                self._version_floor = min(self._version_floor, _newest_version(rest))
                self._taken[key] = self._taken.get(key, 0) + need
                chunk = chunk.slice(slice(0, need))
            else:
                self._finish(key)
            batch.append(chunk)
            taken += self.count([chunk])
        self.pending_steps -= taken
        return batch

    def _finish(self, key: str) -> None:
        self._finished.add(key)
        self._taken.pop(key, None)

    def checkpoint_state(self) -> Covered:
        """What a checkpoint written now covers."""
        trained, stale = self.trained | self._finished, self.stale | self._dropped
        done = [f.path for f in self._files if (trained | stale).issuperset(f.keys)]
        return Covered(sorted(trained), sorted(stale), dict(self._taken), done)

    def checkpointed(self, covered: Covered) -> None:
        """A checkpoint of `covered` is on disk: delete the files it covers."""
        self.trained.update(covered.trained)
        self.stale.update(covered.stale)
        self._finished.difference_update(covered.trained)
        self._dropped.difference_update(covered.stale)
        gone = set(covered.files)
        for path in gone:
            path.unlink(missing_ok=True)
        self._files = [f for f in self._files if f.path not in gone]

    def _add(self, batch: DecodedBatch) -> list[str]:
        """Take a batch's new chunks, count its refused and duplicate ones; the keys taken."""
        try:
            sorted_ = self._sort(batch)
        except Exception as exc:  # not a refusal the sorting knows: nothing of the batch was recorded
            what = f"all of the batch from server {batch.server_id}: {exc!r}"
            self.reject("unreadable batch", sum(entry.chunks for entry in batch.entries), what, exc_info=exc)
            return []
        return self._record(sorted_)

    def _record(self, sorted_: _Sorted) -> list[str]:
        """Count a sorted batch's refused and duplicate chunks, take its new ones; their keys."""
        for reason, chunks, what, error in sorted_.refused:
            self.reject(reason, chunks, what, exc_info=error)
        self.duplicates += sorted_.duplicates
        for key, (episode, steps, newest_version) in sorted_.taken.items():
            self._seen.add(key)
            self.pending.append(episode)
            self._version_floor = min(self._version_floor, newest_version)
            self.pending_steps += steps
            self._track_return(episode)
        return list(sorted_.taken)

    def _sort(self, batch: DecodedBatch) -> _Sorted:
        """Sort a decoded batch's chunks, changing nothing: which are new, which refused, which duplicates (a resent
        chunk is a duplicate whatever it holds, as a refused one was refused when it first came)."""
        sorted_ = _Sorted()
        for entry in batch.entries:
            if entry.key is not None and (entry.key in self._seen or entry.key in sorted_.taken):
                sorted_.duplicates += 1
                continue
            if entry.episode is None:
                sorted_.refused.append((entry.reason, entry.chunks, entry.what, entry.error))
                continue
            assert entry.key is not None  # a chunk has its key
            episode = entry.episode
            if entry.key in self._taken:  # split before a restart: its first steps are trained already
                episode = episode.slice(slice(self._taken[entry.key], None), len_lookback_buffer=self.lookback)
            sorted_.taken[entry.key] = (episode, self.count([episode]), _newest_version(episode))
        return sorted_

    def reject(self, reason: str, chunks: int, what: str, exc_info: BaseException | None = None) -> None:
        """Count `chunks` refused for `reason` (status, and `on_reject`: metrics) and log one line saying `what`
        (with `exc_info`'s traceback, if given); the learner counts a server's connector state it refuses here too."""
        self.rejected[reason] += chunks
        self.on_reject(reason, chunks)
        log.warning("rejected %s", what, exc_info=exc_info)

    def take_finished(self) -> list[tuple[float, int]]:
        """(return, length) of every episode that finished since the last call, in order."""
        finished, self.finished = self.finished, []
        return finished

    def _track_return(self, episode: SingleAgentEpisode) -> None:
        """Add a taken chunk to its episode's return and length; count the episode when its last chunk comes."""
        if episode.multi_agent_episode_id is not None:  # an agent's chunk: counted with its multi-agent episode
            whole = self._multi_agent.add(episode)
            if whole is not None:
                self._count_multi_agent(whole)
            return
        earlier_return, earlier_length, chunks = self._running.pop(episode.id_, (0.0, 0, 0))
        if episode.chunk_index != chunks:  # not all its earlier chunks were counted: refused, forgotten (below), or
            return  # trained before a restart. Its return would be partial: it is not counted.
        if episode.session_closed:  # cut off when its client left: it did not finish (nor does RLlib count such)
            return
        total, length = earlier_return + episode.get_return(), earlier_length + len(episode)
        if episode.is_done:
            self._count(total, length)
            return
        self._running[episode.id_] = (total, length, chunks + 1)
        if len(self._running) > self.max_running:
            forgotten = next(iter(self._running))
            del self._running[forgotten]
            log.info("episode %s not counted: %d others ran on since its last chunk", forgotten, self.max_running)

    def _count(self, episode_return: float, length: int) -> None:
        self.episodes_finished += 1
        self.returns.append(episode_return)
        self.lengths.append(length)
        self.finished.append((episode_return, length))

    def _count_multi_agent(self, episode: EpisodeReturns) -> None:
        self._count(episode.episode_return, episode.env_steps)
        for windows, returns in (
            (self.module_returns, episode.module_returns),
            (self.agent_returns, episode.agent_returns),
        ):
            for key, value in returns.items():
                windows.setdefault(key, deque(maxlen=RETURN_WINDOW)).append(value)


def _newest_version(chunk: SingleAgentEpisode) -> int:
    """The model version that chose the chunk's last action (as new as any in it); unknown counts as fresh."""
    versions = chunk.extra_model_outputs.get(Columns.MODEL_VERSION)
    if versions is None or not len(chunk):
        return np.iinfo(np.int64).max
    return int(np.max(versions.data[versions.lookback :]))  # the chunk's own steps (as get(), for less)


def _set_unreadable_aside(path: Path, why: str) -> None:
    """Rename an intake file that cannot be read (`why`: one that does not decode was not written by a learner,
    which writes them whole) so no intake reads it again, and say so: the learner goes on with the rest, nothing
    is deleted."""
    aside = path.with_name(f"{path.name}.unreadable")
    path.rename(aside)
    log.warning("intake file %s %s: moved to %s, unread", path, why, aside)


def _set_aside(directory: Path) -> None:
    """Move an earlier run's intake files into a subfolder, where no intake reads them (nothing is deleted)."""
    earlier = sorted(directory.glob("*.pb"))
    if earlier:
        aside = directory / f"set-aside-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        aside.mkdir()
        for path in earlier:
            path.rename(aside / path.name)
        log.warning("not resuming: %d intake files of an earlier run moved to %s, unread", len(earlier), aside)
