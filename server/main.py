"""`rlgate serve`: the inference server, gRPC and HTTP on one event loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import gymnasium as gym
import torch
from grpc_health.v1 import health

from rlgate.core import codec
from rlgate.core.spaces import flat_size
from rlgate.policy.acting import ActingCore
from rlgate.server.batcher import Batcher
from rlgate.server.learner_link import LearnerLink
from rlgate.server.metrics import ServerMetrics
from rlgate.server.multi_agent_batcher import MultiAgentBatcher
from rlgate.server.multi_agent_session import MultiAgentSessionSpec
from rlgate.server.service import SERVICE_NAME, PolicyService, RequestError
from rlgate.server.session import SessionSpec
from rlgate.server.settings import ServerSettings
from rlgate.server.shipping import Chunk, DirectorySink, episode_end
from rlgate.server.workers import run_workers
from rlgate.service.http import HttpServer, build_app, read_page
from rlgate.service.process import run_until_signal, start_grpc_server
from rlgate.service.settings import require_device
from rlgate.spec import checkpoint
from rlgate.spec.env import agent_spaces, env_spaces
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import spaces_by_agent
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

MAX_LISTED = 200  # sessions listed by /sessions


class InferenceServer:
    """Owns the policy, batcher, sinks, gRPC server and HTTP server of one `rlgate serve` process."""

    def __init__(self, settings: ServerSettings, spec: RunSpec | None = None, *, shared_port: bool = False) -> None:
        """`spec`: the run spec of a fresh model (else settings.config's); with a learner, the learner's run
        spec known in advance, whose version 0 is served at once (see `_learners_spec`).
        `shared_port`: listen beside the other workers of `rlgate serve --workers N` (SO_REUSEPORT)."""
        self.settings = settings
        self.shared_port = shared_port
        if settings.checkpoint and (spec or settings.config or settings.env):
            raise SpecError(
                "--config and --env describe a fresh model: a server with --checkpoint serves the checkpoint's run spec"
            )
        if settings.learner and settings.env:
            raise SpecError(
                "--env describes a fresh model: a server with --learner serves the run spec that comes with the "
                "learner's weights (--config may give that spec in advance, to serve its version 0 at once)"
            )
        # A spec given here is the operator's own: the code it names may be imported.
        if settings.checkpoint:
            self.spec: RunSpec | None = None
        elif settings.learner:
            self.spec = self._learners_spec(spec) if spec or settings.config else None
        else:
            self.spec = self._standalone_spec(spec)
        self.from_learner = False  # the served weights came from the learner (not a version 0 built here)
        self.imports = ImportPolicy([*settings.allow_import, *(self.spec.modules() if self.spec else ())])
        self.refused: str | None = None  # why this server will not serve the learner's run spec
        self.metrics = ServerMetrics()
        self.metrics.report_pause(self._pause_reason)
        self.files = DirectorySink(settings.episode_dir, self._served) if settings.episode_dir else None
        self.learner: LearnerLink | None = None
        if settings.learner:
            self.learner = LearnerLink(
                settings.learner,
                settings.spool_dir / settings.server_id,
                server_id=settings.server_id,
                on_weights=self._apply_weights,
                current_version=lambda: self.policy.version if self.policy and self.from_learner else -1,
                connector_delta=self._connector_delta,
                metrics=self.metrics,
                max_spool_bytes=settings.max_spool,
                on_room=self._wake_batcher,
                unshipped=self._unshipped_steps,
                hold_episodes=self.spec is not None,  # its own version 0's, until the learner's spec matches
                describe=self._report,
                token=settings.bearer_token(),
                tls_ca=settings.learner_tls_ca.read_bytes() if settings.learner_tls_ca else None,
            )
        self.service = PolicyService(
            settings,
            self.metrics,
            self._policy_for,
            self._ship,
            ships=self._ships,
        )
        self.policy: ActingCore | None = None
        self.batcher: Batcher | None = None
        self.port = 0
        self.http_port = 0
        self._policy_lock = asyncio.Lock()
        self._health = health.aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._http: HttpServer | None = None

    async def start(self) -> None:
        """Bind both ports (0 picks free ones), build the model if its spaces are known, start serving."""
        s = self.settings
        torch.set_num_threads(s.torch_threads)
        if s.checkpoint:
            found = checkpoint.load(s.checkpoint)
            weights = (
                {"weights": found.module_weights, "module_versions": found.module_versions}
                if found.spec.multi_agent
                else {"weights": found.weights}
            )
            with found.loading_weights():
                policy = await self._new_policy(
                    found.spec,
                    found.observation_space,
                    found.action_space,
                    connector_state=found.connector_state,
                    version=found.version,
                    **weights,
                )
            self._set_policy(policy)
        elif self.spec is not None and "env" in self.spec.model_fields_set:
            if self.spec.multi_agent:
                spaces = spaces_by_agent(agent_spaces(self.spec.env, self.imports))
            else:
                spaces = env_spaces(self.spec.env, self.imports)
            self._set_policy(await self._new_policy(self.spec, *spaces))
            if self.learner is not None:  # until the learner's weights say otherwise, its pacing for one server
                self.learner.window = self.spec.algorithm.max_unacked_steps(servers=1)
        app = build_app(
            "rlgate inference server",
            registry=self.metrics.registry,
            status=self.status,
            ready=self.readiness,
            page=read_page("rlgate.server"),
        )

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
            return self.policy.spec.model_dump(mode="json") if self.policy else None

        self._http = HttpServer(app, s.host, s.http_port)  # both ports are taken before anything starts
        reject = self.metrics.rejected.labels("UNAUTHENTICATED").inc
        self._grpc, self.port = await start_grpc_server(
            SERVICE_NAME,
            lambda server: server.add_generic_rpc_handlers([self.service.handler()]),
            self._health,
            address=f"{s.host}:{s.port}",
            max_message_bytes=s.max_message_bytes,
            token=s.bearer_token(),
            on_reject=reject,
            tls=s.tls(s.tls_client_ca),
            reuse_port=self.shared_port,
        )
        if self.files is not None:
            self.files.start()
        if self.learner is not None:
            self.learner.start()
        if self.files is None and self.learner is None:
            log.warning("episodes are not recorded: set --learner or --episode-dir to keep them")
        self._http.start()
        self.http_port = self._http.port
        log.info("serving grpc=%s:%d http=%s:%d", s.host, self.port, s.host, self.http_port)

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, refuse new sessions, end open ones at their next message, flush."""
        self.service.draining = True
        await self._health.enter_graceful_shutdown()
        if self._grpc is not None:
            await self._grpc.stop(self.settings.drain_timeout_s)
        if self.batcher is not None:
            await self.batcher.stop()
        if self.files is not None:
            await self.files.stop()
        if self.learner is not None:
            await self.learner.stop(self.settings.drain_timeout_s)
        if self._http is not None:
            await self._http.stop()
        log.info("stopped")

    def status(self) -> dict[str, Any]:
        policy = self.policy
        return {
            "model_version": policy.version if policy else None,
            "observation_space": str(policy.observation_space) if policy else None,
            "action_space": str(policy.action_space) if policy else None,
            "sessions": len(self.service.sessions),
            "env_steps": self.service.env_steps,
            "non_finite_rejected": dict(self.service.non_finite_rejected),
            "draining": self.service.draining,
            "paused": self._pause_reason(),
            "unacked_steps": self.learner.unacked_steps() if self.learner else None,
            "learner": self.learner.status() if self.learner else None,
            **self._batches(),
            "env_id": policy.spec.env.id if policy else None,
            "learner_page": self.learner.learner_page() if self.learner else None,
        }

    def _batches(self) -> dict[str, Any]:
        """Forward passes so far and their mean size in env steps (from the batch size histogram)."""
        count = self.metrics.registry.get_sample_value("rlgate_batch_size_count") or 0.0
        total = self.metrics.registry.get_sample_value("rlgate_batch_size_sum") or 0.0
        return {"batches": int(count), "mean_batch_size": total / count if count else None}

    def _served(self) -> tuple[RunSpec | None, gym.Space | None]:
        """The served policy's run spec and env observation space (for the episode files' metadata)."""
        policy = self.policy
        return (policy.spec, policy.observation_space) if policy else (self.spec, None)

    def _report(self) -> learner_pb2.ServerReport:
        """How this server is doing, for its learner (the link adds the spool)."""
        return learner_pb2.ServerReport(
            http_port=self.http_port,
            sessions=len(self.service.sessions),
            env_steps=self.service.env_steps,
            model_version=self.policy.version if self.policy else -1,
            paused=(self.batcher.pause_reason() if self.batcher else None) or "",
        )

    def _standalone_spec(self, given: RunSpec | None) -> RunSpec:
        """The run spec of a fresh model: the one given in Python, else --config's, with --env and --seed.
        Its env is built (for its spaces) only when one is named; else the first session's spaces count."""
        s = self.settings
        spec = given or (RunSpec.load(s.config) if s.config else RunSpec())
        if s.env:
            spec = spec.model_copy(update={"env": spec.env.model_copy(update={"id": s.env})})
        if spec.seed is None and s.seed is not None:
            spec = spec.model_copy(update={"seed": s.seed})
        return spec

    def _learners_spec(self, given: RunSpec | None) -> RunSpec:
        """The learner's run spec, given in advance (`rlgate up` does): its version 0 is a fresh model of it,
        built alike here and in the learner from the spec's seed, so this server serves it at once instead of
        waiting for the learner's first weights, which then must come with the same spec (else it refuses them).
        A spec without a seed would give the two other weights: SpecError."""
        s = self.settings
        spec = given or RunSpec.load(s.config)
        if spec.seed is None:
            raise SpecError(
                "--config with --learner: the run spec needs a seed, so that this server's version 0 is the "
                "learner's (or leave --config out: the server then waits for the learner's weights)"
            )
        return spec

    def readiness(self) -> tuple[bool, str | None]:
        """(ready, reason) for /readyz: ready while this server can answer steps.

        A learner that is away does not make it unready at once: serving goes on while there is room for
        the episodes (the learner's window of unacknowledged steps, the spool), and the reason says the
        learner is unreachable. Once sampling pauses for want of that room, nothing is answered until the
        learner is back: not ready, so new clients go to another server, if any. (With the learner there,
        a pause is its pacing, over in a moment: still ready.)
        """
        if self.service.draining:
            return False, "shutting down"
        if self.refused is not None:
            return False, self.refused
        if self.policy is None and self.learner is not None:
            return False, "no model yet: waiting for the learner's first weights"
        away = self.learner.away_for() if self.learner else None
        if self.learner is None or away is None:
            return True, None
        gone = f"the learner at {self.learner.target} has been unreachable for {away:.0f} s"
        paused = self._pause_reason()
        if paused is not None:
            return False, f"{gone}, and sampling is paused until it is back ({paused})"
        link = self.learner
        fill = link.spool.bytes / link.spool.max_bytes
        room = f"{link.unacked_steps()} of {link.window} steps unacknowledged, " if link.window else ""
        return True, f"{gone}; serving goes on while there is room ({room}spool {fill:.0%} full)"

    def _pause_reason(self) -> str | None:
        return self.batcher.pause_reason() if self.batcher else None

    async def _policy_for(self, session: SessionSpec | MultiAgentSessionSpec) -> tuple[ActingCore, Batcher]:
        """The served policy; without one yet, a fresh model for the first session's spaces (of bounded size;
        later hellos wait for it, while the event loop goes on serving)."""
        async with self._policy_lock:
            if self.policy is None and self.learner is not None:
                reason = self.refused or "no model yet: waiting for the learner's first weights"
                raise RequestError(grpc.StatusCode.UNAVAILABLE, reason)
            if self.policy is None:
                assert self.spec is not None
                if isinstance(session, MultiAgentSessionSpec) != bool(self.spec.multi_agent):
                    raise RequestError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        "this server serves a multi-agent run: declare the env's agents in hello.agents (rlgate env: a "
                        "PettingZoo env and a run spec with [multi_agent])"
                        if self.spec.multi_agent
                        else "this server serves a single-agent run: a multi-agent client needs a run spec with "
                        "[multi_agent]",
                    )
                if isinstance(session, MultiAgentSessionSpec):
                    spaces = spaces_by_agent(session.agent_spaces)
                else:
                    spaces = (session.observation_space, session.action_space)
                limit = self.settings.max_fresh_space_size
                for name, space in zip(("observation_space", "action_space"), spaces, strict=True):
                    size = flat_size(space)
                    if size > limit:
                        raise RequestError(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"hello.{name}: {size} values when flattened; this server builds a fresh model for "
                            f"at most {limit} (its --max-fresh-space-size)",
                        )
                self._set_policy(await self._new_policy(self.spec, *spaces))
        assert self.policy is not None and self.batcher is not None
        return self.policy, self.batcher

    async def _new_policy(
        self,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        **source: Any,
    ) -> ActingCore:
        """The spec's policy for these env spaces on this server; `source`: weights, version, ... if any.
        Multi-agent: the spaces are Dicts by agent id. Built on a worker thread: a large model takes seconds,
        and the event loop serves /healthz meanwhile."""
        s = self.settings
        return await asyncio.to_thread(
            ActingCore.build,
            spec,
            observation_space,
            action_space,
            self.imports,
            device=s.device,
            seed=s.seed,
            stage_seconds=self.metrics.stage_seconds,
            backend=s.backend,
            **source,
        )

    def _set_policy(self, policy: ActingCore) -> None:
        self.policy = policy
        self.metrics.model_version.set(policy.version)
        s = self.settings
        self.batcher = (MultiAgentBatcher if policy.multi_agent else Batcher)(
            policy,
            waiting_for_acks=self.learner.over_window if self.learner else lambda: False,
            flush=self._flush_sessions,
            backlogged=self.learner.full if self.learner else lambda: False,
            max_batch_size=s.max_batch_size,
            metrics=self.metrics,
            thread=s.device == "cuda" if s.inference_thread is None else s.inference_thread,
        )
        self.batcher.start()
        log.info("model ready observation_space=%s action_space=%s", policy.observation_space, policy.action_space)

    async def _connector_delta(self) -> dict[str, Any]:
        """The served pipeline's statistics since the last call (taken between batches), for the learner."""
        if self.policy is None or self.batcher is None:
            return {}
        return await self.batcher.between_batches(self.policy.take_connector_delta)

    def _wake_batcher(self) -> None:
        if self.batcher is not None:
            self.batcher.wake()

    def _unshipped_steps(self) -> int:
        """Env steps in exploring sessions' running episodes: what the learner is still to get."""
        return sum(session.unshipped_steps() for session in self.service.sessions.values() if session.spec.explore)

    def _flush_sessions(self) -> None:
        for session in self.service.sessions.values():
            self._ship(session.flush(), session.spec.explore)

    def _ships(self, explore: bool) -> bool:
        """Whether anything takes the chunks of a session that explores or not (see `_ship`)."""
        return self.files is not None or (explore and self.learner is not None)

    def _ship(self, chunks: list[Chunk], explored: bool) -> None:
        """Chunks to the episode files, and those sampled exploring to the learner: a greedy session's actions
        (explore=False, an evaluation) carry no log-probabilities, and training on them would be off-policy. A
        server refusing the learner's spec samples with another model: its steps must not train this one."""
        if not chunks:
            return
        ends = self.metrics.episode_ends
        for chunk in chunks:
            ends[episode_end(chunk)].inc()
        if self.files is not None:
            self.files.ship(chunks)
        if self.learner is not None and explored and not self.refused:
            self.learner.ship(chunks)

    async def _apply_weights(self, weights: learner_pb2.Weights) -> None:
        """A new version from the learner: the first builds the policy from the learner's run spec, later
        ones swap weights between batches. A spec this server may not build is refused: it serves nothing
        and says why (/readyz, and every hello). Every version says how far sampling may run ahead."""
        if self.learner is not None:
            self.learner.window = weights.max_unacked_steps
            self._wake_batcher()
        try:
            spec = RunSpec.from_json(weights.spec_json, "the learner's run spec")
        except SpecError as exc:
            self._refuse(str(exc))
            return
        if self.policy is None:
            try:
                policy = await self._new_policy(
                    spec,
                    codec.space_from_proto(weights.observation_space),
                    codec.space_from_proto(weights.action_space),
                    connector_state=_connector_state(weights),
                    version=weights.version,
                    **_weights(weights, spec),
                )
            except SpecError as exc:
                self._refuse(str(exc))
                return
            async with self._policy_lock:
                self.refused = None
                self._set_policy(policy)
        elif spec != self.policy.spec:
            self._refuse(
                "the learner now runs another run spec than the one this server was built for: restart this "
                "server to serve it (it keeps serving the old version meanwhile, and sends the learner no episodes)"
                if self.from_learner
                else "the learner runs another run spec than --config's: restart this server without --config, or "
                "with the learner's run spec (meanwhile it sends the learner no episodes, so sampling pauses once the "
                "learner's window of steps is spooled)"
            )
            return
        elif self.batcher is not None:
            await self.batcher.between_batches(self._swap_weights, weights, spec)
        self.from_learner, self.refused = True, None  # (a learner that came back with the spec served)
        if self.learner is not None:
            self.learner.release_episodes()

    def _swap_weights(self, weights: learner_pb2.Weights, spec: RunSpec) -> None:
        """Act with a newer version's weights and connector state (between batches)."""
        assert self.policy is not None
        self.policy.set_weights(weights.version, connector_state=_connector_state(weights), **_weights(weights, spec))
        self.metrics.model_version.set(self.policy.version)

    def _refuse(self, reason: str) -> None:
        if reason != self.refused:
            log.error("not serving the learner's weights: %s", reason)
        self.refused = reason


def _weights(weights: learner_pb2.Weights, spec: RunSpec) -> dict[str, Any]:
    """A Weights message's weights, as the acting core of `spec` takes them (per module when multi-agent)."""
    if spec.multi_agent:
        return {"weights": dict(weights.module_weights), "module_versions": dict(weights.module_versions)}
    return {"weights": weights.safetensors}


def _connector_state(weights: learner_pb2.Weights) -> dict[str, Any] | None:
    return codec.from_value(weights.connector_state, "connector_state") if weights.HasField("connector_state") else None


def main(argv: list[str]) -> int:
    settings = ServerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate serve")
    require_device(settings.device)
    if settings.workers > 1:
        return run_workers(settings, serve_worker)
    asyncio.run(run_until_signal(lambda: InferenceServer(settings)))
    return 0


def serve_worker(settings: ServerSettings) -> None:
    """One worker process of `rlgate serve --workers N` (server/workers.py), on the port they share."""
    asyncio.run(run_until_signal(lambda: InferenceServer(settings, shared_port=True)))
