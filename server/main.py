"""`rlgate serve`: the inference server, gRPC and HTTP on one event loop.

The composition root: it makes the parts and wires them, nothing else. The PolicyHost builds and swaps the served
policy (server/host.py); the ShippingRouter takes the sessions' chunks to the episode files and the learner
(server/router.py), whose link (server/learner_link.py) also brings the weights; the WeightsRelay hands what is
served to the clients that act themselves (server/relay.py), whose episodes LocalClients takes in
(server/local_clients.py); the PolicyService runs the clients' streams (server/policy_service.py); ServerStatus
says how it all stands (server/status.py).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import gymnasium as gym
import torch
from grpc_health.v1 import health

from rlgate.server.host import PolicyHost
from rlgate.server.learner_link import LearnerLink
from rlgate.server.local_clients import LocalClients
from rlgate.server.metrics import ServerMetrics
from rlgate.server.policy_service import SERVICE_NAME, PolicyService
from rlgate.server.relay import WeightsRelay
from rlgate.server.router import Sessions, ShippingRouter
from rlgate.server.served_spec import served_spec
from rlgate.server.settings import ServerSettings
from rlgate.server.shipping import DirectorySink
from rlgate.server.status import ServerStatus
from rlgate.service.http import HttpServer, build_app, read_page
from rlgate.service.process import run_until_signal, start_grpc_server
from rlgate.spec.run import RunSpec

log = logging.getLogger(__name__)

# After the drain timeout, how long the sessions still open have to send a message and take their UNAVAILABLE.
LAST_MESSAGE_S = 1.0


class InferenceServer:
    """One `rlgate serve` process: its parts, its gRPC server and its HTTP server."""

    def __init__(self, settings: ServerSettings, spec: RunSpec | None = None, *, shared_port: bool = False) -> None:
        """`spec`: the run spec of a fresh model (else settings.config's); with a learner, the learner's run
        spec known in advance, whose version 0 is served at once (see server/served_spec.py).
        `shared_port`: listen beside the other workers of `rlgate serve --workers N` (SO_REUSEPORT)."""
        s = self.settings = settings
        self.shared_port = shared_port
        self.metrics = ServerMetrics()
        sessions: Sessions = {}
        self.router = ShippingRouter(sessions, self.metrics, files=None, learner=None, refused=self._refused)
        self.relay = WeightsRelay(window=lambda: self.learner.window if self.learner else 0)
        self.host = PolicyHost(
            s,
            self.metrics,
            served_spec(s, spec),
            learner=s.learner is not None,
            pacing=self.router,
            relay=self.relay,
        )
        self.local = LocalClients(self.host, self.router, self.relay, self.metrics, limit=s.max_sessions)
        self.service = PolicyService(s, self.metrics, self.host, self.router, self.local)
        self.learner = self._link() if s.learner else None
        self.router.learner = self.learner
        self.router.files = DirectorySink(s.episode_dir, self._served) if s.episode_dir else None
        self.status = ServerStatus(self.host, self.service, self.learner, self.metrics, self.local)
        self.metrics.report_pause(self.host.pause_reason)
        self.port = 0
        self.http_port = 0
        self._health = health.aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._http: HttpServer | None = None

    def _link(self) -> LearnerLink:
        s, host = self.settings, self.host
        assert s.learner is not None  # linked only with a learner
        link = LearnerLink(
            s.learner,
            s.spool_dir / s.server_id,
            server_id=s.server_id,
            on_weights=host.apply_weights,
            current_version=host.learner_version,
            connector_delta=host.connector_delta,
            metrics=self.metrics,
            max_spool_bytes=s.max_spool,
            on_room=self._room,
            unshipped=self.router.unshipped_steps,
            hold_episodes=host.spec is not None,  # its own version 0's, until the learner's spec matches
            describe=lambda: self.status.report(),
            token=s.bearer_token(),
            tls_ca=s.learner_tls_ca.read_bytes() if s.learner_tls_ca else None,
        )
        if host.spec is not None:  # until the learner's weights say otherwise, its pacing for one server
            link.window = host.spec.algorithm.max_unacked_steps(servers=1)
        return link

    def _room(self) -> None:
        """The learner's pace may allow more (an ack, new weights): sampling and relayed batches look again."""
        self.host.wake()
        self.router.wake()

    def _refused(self) -> bool:
        return self.host.refused is not None

    def _served(self) -> tuple[RunSpec | None, gym.Space | None]:
        """The served run spec and env observation space (for the episode files' metadata)."""
        core = self.host.core
        return (core.spec, core.observation_space) if core else (self.host.spec, None)

    async def start(self) -> None:
        """Bind both ports (0 picks free ones), build the model if its spaces are known, start serving."""
        s = self.settings
        torch.set_num_threads(s.torch_threads)
        await self.host.start()
        app = build_app(
            "rlgate inference server",
            registry=self.metrics.registry,
            status=self.status.status,
            ready=self.status.readiness,
            page=read_page("rlgate.server"),
        )
        self.status.add_routes(app)
        self._http = HttpServer(app, s.host, s.http_port)  # both ports are taken before anything starts
        self._grpc, self.port = await start_grpc_server(
            SERVICE_NAME,
            lambda server: server.add_generic_rpc_handlers([self.service.handler()]),
            self._health,
            address=f"{s.host}:{s.port}",
            max_message_bytes=s.max_message_bytes,
            token=s.bearer_token(),
            on_reject=self.metrics.rejected.labels("UNAUTHENTICATED").inc,
            tls=s.tls(s.tls_client_ca),
            reuse_port=self.shared_port,
        )
        if self.router.files is not None:
            self.router.files.start()
        if self.learner is not None:
            self.learner.start()
        if self.router.files is None and self.learner is None:
            log.warning("episodes are not recorded: set --learner or --episode-dir to keep them")
        self._http.start()
        self.http_port = self.status.http_port = self._http.port
        log.info("serving grpc=%s:%d http=%s:%d", s.host, self.port, s.host, self.http_port)

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, refuse new sessions, hand open ones over at their episodes' end
        (Actions.reconnect) for up to drain_timeout_s (then the rest end UNAVAILABLE, their episodes cut), flush."""
        self.service.draining = True
        await self._health.enter_graceful_shutdown()
        if self._grpc is not None:  # new calls are refused from now on; streams still open after the grace cancelled
            stopped = asyncio.ensure_future(self._grpc.stop(self.settings.drain_timeout_s + LAST_MESSAGE_S))
            await self.service.drain(self.settings.drain_timeout_s)
            await stopped
        await self.host.stop()
        if self.router.files is not None:
            await self.router.files.stop()
        if self.learner is not None:
            await self.learner.stop(self.settings.drain_timeout_s)
        if self._http is not None:
            await self._http.stop()
        log.info("stopped")


def serve(settings: ServerSettings, spec: RunSpec | None) -> int:
    """`rlgate serve` with its settings and run spec read (server/command.py); the exit status."""
    asyncio.run(run_until_signal(lambda: InferenceServer(settings, spec)))
    return 0


def serve_worker(settings: ServerSettings) -> None:
    """One worker process of `rlgate serve --workers N` (server/workers.py), on the port they share."""
    asyncio.run(run_until_signal(lambda: InferenceServer(settings, shared_port=True)))
