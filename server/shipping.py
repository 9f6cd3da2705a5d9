"""Where finished episodes (and chunks of running ones) go: sinks fed by the sessions.

Sessions hand over `Chunk`s, their columns as arrays, which each sink encodes as it sends or writes them.
`ship()` never blocks the event loop's hot path: it queues the chunks, and a worker task delivers them.
`DirectorySink` writes one `rlgate.v1.Episode` file per chunk (offline data), with the spaces and run spec
beside them (rlgate.storage.episode_files, which reads them back); the learner sink (server/learner_link.py)
streams them to the learner as `rlgate.v1.EpisodeChunks` tables, with acks and a spool.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym

from rlgate.episodes.chunk import Chunk
from rlgate.episodes.chunk_codec import chunk_message
from rlgate.spec.run import RunSpec
from rlgate.storage.episode_files import Recording, read_metadata, write_metadata

log = logging.getLogger(__name__)


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
        self._queue: asyncio.Queue[list[Chunk]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlgate-episode-files")

    def ship(self, chunks: list[Chunk]) -> None:
        if chunks:
            self._queue.put_nowait(chunks)

    async def stop(self) -> None:
        """Write everything queued, then stop."""
        await self._queue.join()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            chunks = await self._queue.get()
            try:
                await asyncio.to_thread(self._describe, chunks[0])
                for chunk in chunks:
                    await asyncio.to_thread(self._write, chunk)
            except Exception:
                log.exception("could not write episodes to %s", self.directory)
            finally:
                self._queue.task_done()

    def _write(self, chunk: Chunk) -> None:
        message = chunk_message(chunk.columns)
        (self.directory / f"{message.id}-{message.chunk_index}.pb").write_bytes(message.SerializeToString())

    def _describe(self, chunk: Chunk) -> None:
        """Make sure the directory's metadata.json describes this chunk's data (the first chunk writes it)."""
        spec, env_space = self._context()
        assert chunk.observation_space is not None and chunk.action_space is not None  # a session's chunks have both
        recording = Recording(chunk.observation_space, chunk.action_space, env_space, spec)
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
