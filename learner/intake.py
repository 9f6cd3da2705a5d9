"""Episode intake: chunks from every server, de-duplicated, kept on disk until a checkpoint holds them.

A batch is acknowledged only after it is written to `intake_dir`, and its file is deleted only after a
checkpoint includes the update that trained on it. A learner killed at any moment therefore restarts
from its last checkpoint, reloads the chunks trained since (or never trained) from the intake files,
and recognises every re-sent chunk by (episode id, chunk index): each chunk is trained on exactly once.
A learner that does not resume (a fresh model) sets an earlier run's intake files aside, unread: their
actions came from another model, whose version numbers mean nothing to the new one.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym

from rlgate.core import codec
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.codec import episode_from_proto
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

RETURN_WINDOW = 20


def chunk_key(episode_id: str, chunk_index: int) -> str:
    return f"{episode_id}:{chunk_index}"


@dataclass
class _File:
    path: Path
    keys: list[str]
    trained: bool = False


@dataclass
class Intake:
    """Pending chunks, the keys already seen, and episode returns for progress reporting.

    `observation_spaces`: the spaces a batch may say its observations are in (the env's and each
    env-to-module piece's output); the first is assumed when a batch says none.
    """

    directory: Path
    observation_spaces: list[gym.Space]
    action_space: gym.Space
    trained: set[str] = field(default_factory=set)  # keys in the last checkpoint
    pending: list[SingleAgentEpisode] = field(default_factory=list)
    pending_steps: int = 0
    episodes_finished: int = 0
    duplicates: int = 0
    rejected: int = 0
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    return_history: list[tuple[float, float]] = field(default_factory=list)  # (unix time, return)
    resume: bool = True  # reload the intake files found in `directory`; False: set them aside

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            _set_aside(self.directory)
        self._seen = set(self.trained)
        self._files: list[_File] = []
        self._running_return: dict[str, float] = {}
        for path in sorted(self.directory.glob("*.pb"), key=lambda p: p.stat().st_mtime):
            accepted = self._add(learner_pb2.EpisodeBatch.FromString(path.read_bytes()))
            self._files.append(_File(path, accepted))
        if self._files:
            log.info("resumed intake files=%d pending_steps=%d", len(self._files), self.pending_steps)

    def accept(self, batch: learner_pb2.EpisodeBatch) -> learner_pb2.EpisodeAck:
        """Take a batch: store its new chunks durably, then acknowledge it."""
        duplicates, rejected = self.duplicates, self.rejected
        accepted = self._add(batch)
        if accepted:
            path = self.directory / f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.pb"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(batch.SerializeToString())
            tmp.replace(path)
            self._files.append(_File(path, accepted))
        return learner_pb2.EpisodeAck(
            seq=batch.seq,
            accepted=len(accepted),
            duplicates=self.duplicates - duplicates,
            rejected=self.rejected - rejected,
        )

    def take(self) -> list[SingleAgentEpisode]:
        """All pending chunks, for one update; their files become deletable at the next checkpoint."""
        episodes, self.pending, self.pending_steps = self.pending, [], 0
        for file in self._files:
            file.trained = True
        return episodes

    def checkpoint_state(self) -> tuple[list[str], list[Path]]:
        """What a checkpoint written now covers: all trained keys, and the intake files it makes redundant."""
        done = [f for f in self._files if f.trained]
        keys = self.trained.union(*(f.keys for f in done))
        return sorted(keys), [f.path for f in done]

    def checkpointed(self, keys: list[str], files: list[Path]) -> None:
        """A checkpoint with these keys is on disk: delete the files it covers."""
        self.trained.update(keys)
        gone = set(files)
        for path in gone:
            path.unlink(missing_ok=True)
        self._files = [f for f in self._files if f.path not in gone]

    def _add(self, batch: learner_pb2.EpisodeBatch) -> list[str]:
        accepted = []
        try:
            observation_space = self._observation_space(batch)
        except ValueError as exc:
            self.rejected += len(batch.episodes)
            log.warning("rejected %d chunks from server %s: %s", len(batch.episodes), batch.server_id, exc)
            return accepted
        for message in batch.episodes:
            key = chunk_key(message.id, message.chunk_index)
            if key in self._seen:
                self.duplicates += 1
                continue
            try:
                episode = episode_from_proto(message, observation_space, self.action_space)
            except ValueError as exc:  # CodecError included: one bad chunk never blocks the others
                self.rejected += 1
                log.warning("rejected chunk %s from server %s: %s", key, batch.server_id, exc)
                continue
            self._seen.add(key)
            self.pending.append(episode)
            self.pending_steps += len(episode)
            accepted.append(key)
            self._track_return(episode)
        return accepted

    def _observation_space(self, batch: learner_pb2.EpisodeBatch) -> gym.Space:
        """The space the batch's observations are in: what it says, if that is one of the known spaces."""
        if not batch.HasField("observation_space"):
            return self.observation_spaces[0]
        space = codec.space_from_proto(batch.observation_space, "observation_space")
        if space not in self.observation_spaces:
            raise ValueError(f"observation_space {space} is neither the env's nor an env-to-module piece's")
        return space

    def _track_return(self, episode: SingleAgentEpisode) -> None:
        total = self._running_return.pop(episode.id_, 0.0) + episode.get_return()
        if episode.is_done:
            self.episodes_finished += 1
            self.returns.append(total)
            self.return_history.append((time.time(), total))
        else:
            self._running_return[episode.id_] = total


def _set_aside(directory: Path) -> None:
    """Move an earlier run's intake files into a subfolder, where no intake reads them (nothing is deleted)."""
    earlier = sorted(directory.glob("*.pb"))
    if earlier:
        aside = directory / f"set-aside-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        aside.mkdir()
        for path in earlier:
            path.rename(aside / path.name)
        log.warning("not resuming: %d intake files of an earlier run moved to %s, unread", len(earlier), aside)
