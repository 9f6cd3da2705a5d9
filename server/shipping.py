"""Where finished episodes (and chunks of running ones) go: sinks fed by the sessions.

`ship()` never blocks the event loop's hot path: it queues the episodes, and a worker task encodes
and delivers them. `DirectorySink` writes one `rlgate.v1.Episode` file per chunk (offline data), with
the spaces and run spec beside them (rlgate.spec.episode_files, which reads them back); the learner
sink (server/learner_link.py) streams them to the learner with acks and a spool.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym

from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.codec import episode_to_proto
from rlgate.spec.episode_files import Recording, read_metadata, write_metadata
from rlgate.spec.run import RunSpec

log = logging.getLogger(__name__)


#: How a shipped chunk can end (`episode_end`): the `end` label of the rlgate_episodes counter.
EPISODE_ENDS = ("terminated", "truncated", "cut")


def episode_end(episode: SingleAgentEpisode) -> str:
    """How a chunk ended, for metrics and logs: terminated, truncated or cut (the episode goes on)."""
    if episode.is_terminated:
        return "terminated"
    return "truncated" if episode.is_truncated else "cut"


class DirectorySink:
    """Writes every chunk to `directory/<episode id>-<chunk index>.pb`, and `metadata.json` beside them.

    `context()`: the served policy's run spec and env observation space (None before there is a policy).
    A directory whose metadata describes other spaces is left alone: the chunks go to a new subfolder.
    """

    def __init__(
        self, directory: Path, context: Callable[[], tuple[RunSpec | None, gym.Space | None]] = lambda: (None, None)
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._context = context
        self._recording: Recording | None = None
        self._queue: asyncio.Queue[list[SingleAgentEpisode]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlgate-episode-files")

    def ship(self, episodes: list[SingleAgentEpisode]) -> None:
        if episodes:
            self._queue.put_nowait(episodes)

    async def stop(self) -> None:
        """Write everything queued, then stop."""
        await self._queue.join()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            episodes = await self._queue.get()
            try:
                await asyncio.to_thread(self._describe, episodes[0])
                for episode in episodes:
                    message = episode_to_proto(episode)
                    path = self.directory / f"{message.id}-{message.chunk_index}.pb"
                    await asyncio.to_thread(path.write_bytes, message.SerializeToString())
            except Exception:
                log.exception("could not write episodes to %s", self.directory)
            finally:
                self._queue.task_done()

    def _describe(self, episode: SingleAgentEpisode) -> None:
        """Make sure the directory's metadata.json describes this chunk's data (the first chunk writes it)."""
        spec, env_space = self._context()
        recording = Recording(episode.observation_space, episode.action_space, env_space, spec)
        if self._recording is not None and self._recording.same_data(recording):
            return
        found = read_metadata(self.directory) if self._recording is None else self._recording
        if found is not None and not found.same_data(recording):
            other = self.directory / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            other.mkdir()
            log.error(
                "%s holds episodes of observations %s, actions %s; these are %s, %s: writing them to %s",
                self.directory,
                found.observation_space,
                found.action_space,
                recording.observation_space,
                recording.action_space,
                other,
            )
            self.directory = other
        write_metadata(self.directory, recording)
        self._recording = recording
