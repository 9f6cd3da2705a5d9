"""What one server says about itself: /status, /readyz, /sessions, /spec, and its report to the learner."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from rlgate.server.host import PolicyHost
from rlgate.server.learner_link import LearnerLink
from rlgate.server.local_clients import LocalClients
from rlgate.server.metrics import ServerMetrics
from rlgate.server.policy_service import PolicyService
from rlgate.v1 import learner_pb2

MAX_LISTED = 200  # sessions listed by /sessions


class ServerStatus:
    """Reads the server's parts (the host, the sessions' service, the link to the learner, the metrics)."""

    def __init__(
        self,
        host: PolicyHost,
        service: PolicyService,
        learner: LearnerLink | None,
        metrics: ServerMetrics,
        local: LocalClients,
    ) -> None:
        self.host = host
        self.local = local
        self.service = service
        self.learner = learner
        self.metrics = metrics
        self.http_port = 0  # once the HTTP server listens

    def add_routes(self, app: FastAPI) -> None:
        """/sessions and /spec, beside the routes every service has (service.http.build_app)."""

        @app.get("/sessions")
        async def sessions() -> list[dict[str, Any]]:
            """The open sessions (at most MAX_LISTED): who is connected, with how many sub-envs."""
            return [
                {"id": key, "client_id": s.spec.client_id, "num_envs": s.spec.num_envs, "explore": s.spec.explore}
                for key, s in list(self.service.sessions.items())[:MAX_LISTED]
            ]

        @app.get("/spec")
        async def spec() -> dict[str, Any] | None:
            """The run spec of the served policy (null before there is one)."""
            core = self.host.core
            return core.spec.model_dump(mode="json") if core else None

    def status(self) -> dict[str, Any]:
        core, learner = self.host.core, self.learner
        return {
            "model_version": core.version if core else None,
            "observation_space": str(core.observation_space) if core else None,
            "action_space": str(core.action_space) if core else None,
            "sessions": len(self.service.sessions),
            "env_steps": self.service.env_steps,
            "local_clients": self.local.status(),
            "non_finite_rejected": dict(self.service.non_finite_rejected),
            "draining": self.service.draining,
            "paused": self.host.pause_reason(),
            "stalled": self._stalled(),
            "unacked_steps": learner.unacked_steps() if learner else None,
            "learner": learner.status() if learner else None,
            **self._batches(),
            "env_id": core.spec.env.id if core else None,
            "learner_page": learner.learner_page() if learner else None,
        }

    def _stalled(self) -> bool:
        """Whether sampling is paused by more than the learner's pacing (which pauses it while the learner takes
        what was shipped, a moment in every update): the learner away, its run spec refused, or the spool full."""
        link = self.learner
        return self.host.pause_reason() is not None and (
            link is None or not link.connected or link.full() or self.host.refused is not None
        )

    def _batches(self) -> dict[str, Any]:
        """Forward passes so far and their mean size in env steps (from the batch size histogram)."""
        count = self.metrics.registry.get_sample_value("rlgate_batch_size_count") or 0.0
        total = self.metrics.registry.get_sample_value("rlgate_batch_size_sum") or 0.0
        return {"batches": int(count), "mean_batch_size": total / count if count else None}

    def report(self) -> learner_pb2.ServerReport:
        """How this server is doing, for its learner (the link adds the spool)."""
        core = self.host.core
        return learner_pb2.ServerReport(
            http_port=self.http_port,
            sessions=len(self.service.sessions),
            env_steps=self.service.env_steps,
            model_version=core.version if core else -1,
            paused=self.host.pause_reason() or "",
            local_clients=len(self.local.clients),
            local_env_steps=self.local.env_steps,
        )

    def readiness(self) -> tuple[bool, str | None]:
        """(ready, reason) for /readyz: ready while this server can answer steps.

        A learner that is away does not make it unready at once: serving goes on while there is room for
        the episodes (the learner's window of unacknowledged steps, the spool), and the reason says the
        learner is unreachable. Once sampling pauses for want of that room, nothing is answered until the
        learner is back: not ready, so new clients go to another server, if any. (With the learner there,
        a pause is its pacing, over in a moment: still ready.)
        """
        host, link = self.host, self.learner
        if self.service.draining:
            return False, "shutting down"
        if host.refused is not None:
            return False, host.refused
        if host.core is None and link is not None:
            return False, "no model yet: waiting for the learner's first weights"
        away = link.away_for() if link else None
        if link is None or away is None:
            return True, None
        gone = f"the learner at {link.target} has been unreachable for {away:.0f} s"
        paused = host.pause_reason()
        if paused is not None:
            return False, f"{gone}, and sampling is paused until it is back ({paused})"
        fill = link.spool.bytes / link.spool.max_bytes
        room = f"{link.unacked_steps()} of {link.window} steps unacknowledged, " if link.window else ""
        return True, f"{gone}; serving goes on while there is room ({room}spool {fill:.0%} full)"
