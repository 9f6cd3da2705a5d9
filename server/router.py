"""ShippingRouter: where the sessions' episode chunks go, and the pace that those destinations set.

Every chunk goes to the episode files (`--episode-dir`), if any; chunks of exploring sessions go to the learner
too, unless the server refuses the learner's run spec (it samples with another model then, whose steps must not
train this one). A greedy session's chunks (explore=False, an evaluation) carry no log-probabilities: training on
them would be off-policy. The learner's link sets the batcher's pace (`Pacing`): sampling waits while the learner
has not taken enough of what was shipped or the spool is full, and the sessions are flushed meanwhile.

Local-inference clients record their episodes themselves and send them as batches (`relay`): those go the same way,
to the files and the learner's spool, once the same pace allows, so that a client waiting for its ack waits as a
session's batch would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import gymnasium as gym

from rlgate.core.codec import CodecError
from rlgate.episodes.chunk import Chunk, batch_chunks, ending, episode_end
from rlgate.episodes.session import Session
from rlgate.server.learner_link import LearnerLink
from rlgate.server.metrics import ServerMetrics
from rlgate.server.multi_agent_session import MultiAgentSession
from rlgate.server.shipping import DirectorySink
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

Sessions = dict[str, Session | MultiAgentSession]


class ShippingRouter:
    """Routes chunks to the episode files and the learner; the batcher's `Pacing` (see server.host)."""

    def __init__(
        self,
        sessions: Sessions,
        metrics: ServerMetrics,
        *,
        files: DirectorySink | None,
        learner: LearnerLink | None,
        refused: Callable[[], bool],
    ) -> None:
        """`sessions`: the open sessions (by id, as the service keeps them); `refused()`: whether the server
        refuses the learner's run spec now."""
        self.sessions = sessions
        self.metrics = metrics
        self.files = files
        self.learner = learner
        self._refused = refused
        self._room = asyncio.Event()  # set when the learner's pace may allow more (`wake`)

    def ships(self, explore: bool) -> bool:
        """Whether anything takes the chunks of a session that explores or not (where nothing does, single-agent
        sessions build none)."""
        return self.files is not None or (explore and self.learner is not None)

    def ship(self, chunks: list[Chunk], explored: bool) -> None:
        """A session's chunks, counted by how they ended, to the files and (sampled exploring) to the learner."""
        if not chunks:
            return
        ends = self.metrics.episode_ends
        for chunk in chunks:
            ends[episode_end(chunk)].inc()
        if self.files is not None:
            self.files.ship(chunks)
        if self.learner is not None and explored and not self._refused():
            self.learner.ship(chunks)

    async def relay(
        self, batch: learner_pb2.EpisodeBatch, steps: int, spaces: tuple[gym.Space | None, gym.Space | None]
    ) -> None:
        """A local-inference client's batch of `steps` env steps (exploring, sampled by the served run), once the
        learner's pace allows: counted by how its chunks ended, to the episode files (decoded in `spaces`, its
        observation and action space) and into the learner's spool; returns once it is there."""
        while self.waiting_for_acks() or self.backlogged():
            self._room.clear()
            await self._room.wait()
        ends = self.metrics.episode_ends
        for table in batch.chunks:
            for terminated, truncated in zip(table.terminated, table.truncated, strict=True):
                ends[ending(terminated, truncated)].inc()
        if self.files is not None:
            try:
                self.files.ship(batch_chunks(batch, *spaces))
            except CodecError as exc:  # the learner refuses them too, and counts them
                log.warning("a local client's batch does not decode; not in the episode files: %s", exc)
        if self.learner is not None:
            await self.learner.spool_batch(batch, steps)

    def wake(self) -> None:
        """The learner's pace may allow more now (an ack, new weights): relayed batches waiting look again."""
        self._room.set()

    def room(self) -> int | None:
        """Env steps the learner's next update still needs beyond what this server holds (unacknowledged, or in its
        sessions' running episodes), from the learner's last ack; None while unknown (no ack yet, no learner)."""
        link = self.learner
        if link is None or link.room is None:
            return None
        if link.behind():  # the room is for weights not served here yet
            return 0
        return max(0, link.room - link.unacked_steps() - self.unshipped_steps())

    # --- Pacing ---------------------------------------------------------------------------------------------

    def waiting_for_acks(self) -> bool:
        """The learner has not taken enough of what was shipped: sampling waits (see LearnerLink.over_window)."""
        return self.learner is not None and self.learner.over_window()

    def backlogged(self) -> bool:
        """The spool is full: sampling waits for the learner."""
        return self.learner is not None and self.learner.full()

    def flush(self) -> None:
        """Ship every step the sessions have recorded (the learner then has the newest steps while sampling
        waits)."""
        for session in self.sessions.values():
            self.ship(session.flush(), session.spec.explore)

    def unshipped_steps(self) -> int:
        """Env steps in exploring sessions' running episodes: what the learner is still to get."""
        return sum(session.unshipped_steps() for session in self.sessions.values() if session.spec.explore)
