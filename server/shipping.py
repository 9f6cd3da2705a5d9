"""Where finished episodes (and chunks of running ones) go: sinks fed by the sessions.

`ship()` never blocks the event loop's hot path: it queues the episodes, and a worker task encodes
and delivers them. `DirectorySink` writes one `rlgate.v1.Episode` file per chunk (offline data);
the learner sink (server/learner_link.py) streams them to the learner with acks and a spool.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.codec import episode_to_proto

log = logging.getLogger(__name__)


def episode_end(episode: SingleAgentEpisode) -> str:
    """How a chunk ended, for metrics and logs: terminated, truncated or cut (the episode goes on)."""
    if episode.is_terminated:
        return "terminated"
    return "truncated" if episode.is_truncated else "cut"


class DirectorySink:
    """Writes every chunk to `directory/<episode id>-<chunk index>.pb`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
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
                for episode in episodes:
                    message = episode_to_proto(episode)
                    path = self.directory / f"{message.id}-{message.chunk_index}.pb"
                    await asyncio.to_thread(path.write_bytes, message.SerializeToString())
            except Exception:
                log.exception("could not write episodes to %s", self.directory)
            finally:
                self._queue.task_done()
