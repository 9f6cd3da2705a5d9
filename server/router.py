"""ShippingRouter: where the sessions' episode chunks go, and the pace that those destinations set.

Every chunk goes to the episode files (`--episode-dir`), if any; chunks of exploring sessions go to the learner
too, unless the server refuses the learner's run spec (it samples with another model then, whose steps must not
train this one). A greedy session's chunks (explore=False, an evaluation) carry no log-probabilities: training on
them would be off-policy. The learner's link sets the batcher's pace (`Pacing`): sampling waits while the learner
has not taken enough of what was shipped or the spool is full, and the sessions are flushed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

from rlgate.episodes.chunk import Chunk, episode_end
from rlgate.episodes.session import Session
from rlgate.server.learner_link import LearnerLink
from rlgate.server.metrics import ServerMetrics
from rlgate.server.multi_agent_session import MultiAgentSession
from rlgate.server.shipping import DirectorySink

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
