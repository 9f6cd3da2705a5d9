"""`rlgate.v1.PolicyService`: one bidirectional stream per env client, and the local-inference clients' two streams.

Connect's handler only decodes, validates and appends to episodes, then hands the rows to the batcher. WatchWeights
and SubmitEpisodes (clients that act themselves) are thin handlers over `LocalClients`. Every failure a client can
cause ends that client's stream with a precise status and a message a person can act on; nothing it sends can harm
another session or the server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rlgate.core import codec
from rlgate.core.codec import CodecError
from rlgate.core.columns import Columns
from rlgate.core.space_check import NonFiniteError
from rlgate.core.space_diff import space_differences
from rlgate.episodes.session import Session, SessionSpec
from rlgate.server.agents_step_decoder import AgentsStepDecoder, encode_agent_actions
from rlgate.server.batcher import Batcher
from rlgate.server.errors import BadRequest, IdleTimeout, NotServing, OverLimit, UnknownModule, WrongState
from rlgate.server.host import PolicyHost
from rlgate.server.idle import IdleWatch
from rlgate.server.local_clients import MAX_CLIENT_ID, LocalClient, LocalClients
from rlgate.server.metrics import ServerMetrics
from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
from rlgate.server.router import ShippingRouter
from rlgate.server.settings import ServerSettings
from rlgate.server.step_decoder import StepDecoder
from rlgate.service.requests import M, NotAMessage, from_bytes
from rlgate.v1 import learner_pb2
from rlgate.v1 import policy_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "rlgate.v1.PolicyService"
# Longest status message, in UTF-8 bytes: messages quote what the client sent (a map key, a module id, a Dict's
# keys), which may be megabytes; gRPC sends the message percent-encoded (at most 3 bytes per byte) in a trailer,
# and a client refuses trailers over 8 KiB with a bare RESOURCE_EXHAUSTED in place of the status. Logged as sent.
MAX_DETAILS = 1024
# Each session's age limit is max_session_age_s times a draw from this range (gRPC's max connection age jitters
# as much): sessions opened together are handed over apart, not all in one burst.
AGE_JITTER = (0.9, 1.1)
# How a stream ends that goes on after its answer said reconnect (a client that does not read Actions.reconnect).
HANDED_OVER = (
    "session handed over (max session age, or the server is stopping): reconnect through the same target; "
    "every episode it recorded had ended and was shipped"
)


#: The status each error a stream can end with gets (server/errors.py); anything else is the server's own fault:
#: INTERNAL, logged with its traceback, and every other session goes on.
STATUS: dict[type[Exception], grpc.StatusCode] = {
    BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    CodecError: grpc.StatusCode.INVALID_ARGUMENT,
    WrongState: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownModule: grpc.StatusCode.NOT_FOUND,
    OverLimit: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotServing: grpc.StatusCode.UNAVAILABLE,
    IdleTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and message a stream that raised `exc` ends with (STATUS)."""
    for kind in type(exc).__mro__:
        if kind in STATUS:
            return STATUS[kind], str(exc)
    log.error("session failed", exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"server error: {type(exc).__name__}: {exc}"


Handler = Callable[["PolicyService", Any, grpc.aio.ServicerContext], Awaitable[None]]


def ends_with_status(handler: Handler) -> Handler:
    """A stream handler whose errors end the stream with their status (`status_of`), after the handler's own
    clean-up has run; a non-finite value is counted by field besides."""

    @functools.wraps(handler)
    async def serve(service: PolicyService, requests: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            await handler(service, requests, context)
        except Exception as exc:
            if isinstance(exc, NonFiniteError):
                service.count_non_finite(exc.field)
            await service.abort(context, *status_of(exc))

    return serve


@dataclass
class _Stream:
    """What one Connect stream has opened: after its hello, the session and the batcher and decoder serving it."""

    session: Session | MultiAgentSession | None = None
    batcher: Batcher | None = None
    decoder: StepDecoder | AgentsStepDecoder | None = None
    idle: IdleWatch | None = None
    writing: bool = False  # an answer waits for the client to take it
    due: float = math.inf  # perf_counter time after which the session is handed over (max_session_age_s)
    handed_over: bool = False  # an answer told the client to reconnect


class PolicyService:
    """Runs client sessions against the policy; `handler()` registers it on a grpc.aio server."""

    def __init__(
        self,
        settings: ServerSettings,
        metrics: ServerMetrics,
        host: PolicyHost,
        router: ShippingRouter,
        local: LocalClients,
    ) -> None:
        """`host` gives each new session the served core and batcher; `router` takes the chunks sessions make (and
        says whether anything takes those of an exploring or a greedy session: where nothing does, single-agent
        sessions build none). The open sessions are the router's. `local`: the clients that act themselves."""
        self.settings = settings
        self.metrics = metrics
        self.host = host
        self.router = router
        self.local = local
        self.sessions = router.sessions
        self.non_finite_rejected = {"obs": 0, "reward": 0}  # as rlgate_non_finite_rejected_total counts them
        self.draining = False  # handing sessions over, refusing new ones
        self.drain_over = False  # the drain timeout passed: sessions still open end at their next message
        self._watches: set[asyncio.Timeout] = set()  # the WatchWeights streams' age limits: a drain ends them now
        self._no_sessions = asyncio.Event()
        self._stage_seconds = metrics.stage_seconds

    @property
    def env_steps(self) -> int:
        """Env steps received (transitions): the rlgate_env_steps counter."""
        return int(self.metrics.env_steps.value)

    def _lone_session(self) -> bool:
        """Whether one session alone is open: no other could share its batch."""
        return len(self.sessions) == 1

    def handler(self) -> grpc.GenericRpcHandler:
        """Requests arrive as raw bytes so that malformed ones get INVALID_ARGUMENT, not INTERNAL."""
        connect = grpc.stream_stream_rpc_method_handler(
            self.connect, request_deserializer=None, response_serializer=pb.ServerMessage.SerializeToString
        )
        watch = grpc.unary_stream_rpc_method_handler(
            self.watch_weights, request_deserializer=None, response_serializer=learner_pb2.Weights.SerializeToString
        )
        submit = grpc.stream_stream_rpc_method_handler(
            self.submit_episodes,
            request_deserializer=None,
            response_serializer=learner_pb2.EpisodeAck.SerializeToString,
        )
        methods = {"Connect": connect, "WatchWeights": watch, "SubmitEpisodes": submit}
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    @ends_with_status
    async def connect(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        """Serve one client stream until it closes, fails or idles out; what went wrong becomes its status."""
        stream = _Stream()
        try:
            await self._serve(context, stream)
        except TimeoutError:
            waited = "an answer not taken (the client reads none)" if stream.writing else "no message"
            raise IdleTimeout(
                f"{waited} for {self.settings.idle_timeout_s:g} s: session closed, episodes shipped"
            ) from None
        finally:  # before the status is sent: a client that takes no answers takes no status either
            if stream.session is not None:
                self._end(stream.session)

    @ends_with_status
    async def watch_weights(self, raw: bytes, context: grpc.aio.ServicerContext) -> None:
        """A local-inference client's weights: every version this server relays, newest first, until the client is
        handed over (its max session age, or this server drains): the stream then ends with OK, and the client
        reconnects through its target once its episodes sent here are acknowledged (proto/README.md)."""
        if self.draining:
            raise NotServing("server is shutting down: connect to another one")
        request = _parse(learner_pb2.WatchWeightsRequest, raw)
        versions = self.local.weights_after(request)
        age = self.settings.max_session_age_s
        try:
            async with asyncio.timeout(age * random.uniform(*AGE_JITTER) if age else None) as limit:
                self._watches.add(limit)
                try:
                    async for weights in versions:
                        await context.write(weights)
                finally:
                    self._watches.discard(limit)
        except TimeoutError:
            self.metrics.handovers.inc()
            log.info("local client handed over client=%r", request.server_id)

    @ends_with_status
    async def submit_episodes(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        """A local-inference client's episodes: a hello, then batches, each acknowledged once in the spool."""
        client: LocalClient | None = None
        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                message = _parse(pb.EpisodeSubmission, raw)
                kind = message.WhichOneof("kind")
                if self.draining:
                    raise NotServing("server is shutting down: send the episodes to another one")
                if kind == "hello":
                    if client is not None:
                        raise WrongState("hello sent twice on one stream")
                    client = self.local.open(message.hello)
                    # The hello is accepted: a client may wait for this before its first batch (see _send in
                    # client/local.py), so that no batch of its is written to a stream refused at its hello.
                    await context.send_initial_metadata(())
                elif kind == "batch":
                    if client is None:
                        raise WrongState("batch before hello: send a hello naming the run spec first")
                    await context.write(await self.local.take(client, message.batch))
                else:
                    raise BadRequest("empty message: set hello or batch")
        finally:
            if client is not None:
                self.local.close(client)

    async def drain(self, timeout_s: float) -> None:
        """Refuse new sessions and hand every open one over at its episodes' end (Actions.reconnect); after
        `timeout_s` those still open end UNAVAILABLE at their next message, their running episodes cut."""
        self.draining = True
        now = asyncio.get_running_loop().time()
        for limit in self._watches:  # local clients: handed over at once (their episodes run on in the client)
            if not limit.expired():  # one that expired just now is ending its stream already
                limit.reschedule(now)
        self._no_sessions.clear()
        if not self.sessions:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self._no_sessions.wait()
        except TimeoutError:
            self.drain_over = True
            log.info("drain timeout: %d sessions not handed over end at their next message", len(self.sessions))

    def count_non_finite(self, field: str) -> None:
        """A step refused for a NaN or infinite value in `field` (obs, reward)."""
        self.non_finite_rejected[field] += 1
        self.metrics.non_finite_rejected.labels(field).inc()

    async def _serve(self, context: grpc.aio.ServicerContext, stream: _Stream) -> None:
        """Read and answer messages until the client ends the stream; a read, or a write of an answer, waiting
        idle_timeout_s raises TimeoutError."""
        async with IdleWatch(self.settings.idle_timeout_s) as idle:
            stream.idle = idle
            while True:
                idle.waiting_since = idle.now()
                raw = await context.read()
                idle.waiting_since = None
                if raw is grpc.aio.EOF or not await self._answer(context, stream, raw):
                    return

    async def _answer(self, context: grpc.aio.ServicerContext, stream: _Stream, raw: bytes) -> bool:
        """Answer one message; False when it was the client's close."""
        arrived, arrived_cpu = time.perf_counter(), time.thread_time()
        message = _parse(pb.ClientMessage, raw)
        kind = message.WhichOneof("kind")
        if kind == "hello":
            if stream.session is not None:
                raise WrongState("hello sent twice on one stream")
            stream.session, stream.batcher, stream.decoder = await self._open(message.hello)
            if age := self.settings.max_session_age_s:
                stream.due = arrived + age * random.uniform(*AGE_JITTER)
            welcome = pb.Welcome(session_id=stream.session.id, model_version=stream.batcher.core.version)
            await _write(context, stream, pb.ServerMessage(welcome=welcome))
        elif kind == "step":
            session, batcher, decoder = stream.session, stream.batcher, stream.decoder
            if session is None or batcher is None or decoder is None:
                raise WrongState("step before hello: send a hello first")
            if stream.handed_over:
                raise NotServing(HANDED_OVER)
            if self.drain_over:
                raise NotServing("server is shutting down and its drain timeout passed: reconnect to another one")
            if not session.moving and (self.draining or arrived >= stream.due):
                session.move()
            if isinstance(decoder, AgentsStepDecoder):
                reply = await self._multi_agent_step(session, batcher, decoder, message.step)
            else:
                reply = await self._step(session, batcher, decoder, message.step, arrived_cpu)
            if session.moving and session.settled():
                reply.actions.reconnect = stream.handed_over = True
                self.metrics.handovers.inc()
                log.info("session handed over session=%s client=%r", session.id, session.spec.client_id)
            await _write(context, stream, reply)
            self.metrics.step_latency.observe(time.perf_counter() - arrived)
        elif kind == "close":  # the stream ends here, with OK; anything the client sent after it is unread
            if stream.session is None:
                raise WrongState("close before hello")
            return False
        else:
            raise BadRequest("empty message: set hello, step or close")
        return True

    async def _open(
        self, hello: pb.Hello
    ) -> tuple[Session | MultiAgentSession, Batcher, StepDecoder | AgentsStepDecoder]:
        if self.draining:
            raise NotServing("server is shutting down: connect to another one")
        if len(self.sessions) >= self.settings.max_sessions:
            raise OverLimit(
                f"server is full: {self.settings.max_sessions} sessions open",
            )
        if hello.num_envs < 1:
            raise BadRequest("hello.num_envs must be at least 1")
        if len(hello.client_id) > MAX_CLIENT_ID:
            raise BadRequest(
                f"hello.client_id: {len(hello.client_id)} characters > {MAX_CLIENT_ID}",
            )
        limit = self.settings.max_envs_per_session
        if hello.num_envs > limit:
            raise OverLimit(f"hello.num_envs {hello.num_envs} > max_envs_per_session {limit}")
        if hello.module_id not in ("", "default"):
            raise UnknownModule(f"unknown module_id {hello.module_id!r}: this server has 'default'")
        if hello.agents:
            return await self._open_multi_agent(hello)
        if not hello.HasField("observation_space") or not hello.HasField("action_space"):
            raise BadRequest("hello needs observation_space and action_space")
        budget = codec.SpaceBudget()  # for the hello's spaces together
        spec = SessionSpec(
            client_id=hello.client_id,
            observation_space=codec.space_from_proto(hello.observation_space, "hello.observation_space", budget),
            action_space=codec.space_from_proto(hello.action_space, "hello.action_space", budget),
            num_envs=hello.num_envs,
            explore=hello.explore,
        )
        try:
            policy, batcher = await self.host.for_session(spec)
        except ValueError as exc:  # a fresh model that cannot be built for these spaces (e.g. an action space it lacks)
            raise BadRequest(f"no model for the hello's spaces: {exc}") from exc
        differences = space_differences(
            policy.observation_space, spec.observation_space, "observation_space"
        ) + space_differences(policy.action_space, spec.action_space, "action_space")
        if differences:
            raise WrongState(
                "the hello's spaces must equal the served model's; they differ in (server != client): "
                + "; ".join(differences),
            )
        sampling = policy.spec.sampling
        session = Session(
            spec,
            rollout_fragment_length=sampling.rollout_fragment_length
            if sampling.batch_mode == "truncate_episodes"
            else None,
            lookback=sampling.episode_lookback_horizon,
            ships=self.router.ships(spec.explore),
            observation_spaces=[piece.observation_space for piece in policy.env_to_module.connectors],
        )
        self.sessions[session.id] = session
        self.metrics.sessions.set(len(self.sessions))
        decoder = StepDecoder(
            spec.observation_space, spec.num_envs, allow_non_finite_obs=self.settings.allow_non_finite_obs
        )
        log.info("session opened session=%s client=%r num_envs=%d", session.id, spec.client_id, spec.num_envs)
        return session, batcher, decoder

    async def _step(
        self,
        session: Session | MultiAgentSession,
        batcher: Batcher,
        decoder: StepDecoder,
        step: pb.Step,
        arrived_cpu: float,
    ) -> pb.ServerMessage:
        """Decode, append, wait for the batch, record, answer; the stage counters take this thread's CPU time
        (not wall time, which would count other threads' turns on the same core too)."""
        assert isinstance(session, Session)  # opened with its StepDecoder
        obs, rewards, terminateds, truncateds, infos = decoder.decode(step, session.resets_only)
        decoded = time.thread_time()
        episodes, steps = session.observe(obs, rewards, terminateds, truncateds, infos)
        appended = time.thread_time()
        outputs = await batcher.compute(obs, episodes, session.spec.explore, alone=self._lone_session())
        computed = time.thread_time()
        self.router.ship(session.record(outputs), session.spec.explore)
        reply = pb.ServerMessage()
        actions = reply.actions  # filled in place: building the messages and copying them in costs twice as much
        codec.fill_value(actions.actions, outputs[Columns.ACTIONS_FOR_ENV])
        actions.model_version = int(outputs[Columns.MODEL_VERSION][0])
        stage_seconds = self._stage_seconds
        stage_seconds["decode"] += decoded - arrived_cpu
        stage_seconds["append"] += appended - decoded
        stage_seconds["encode"] += time.thread_time() - computed
        self.metrics.env_steps.inc(steps)
        return reply

    async def _open_multi_agent(self, hello: pb.Hello) -> tuple[MultiAgentSession, Batcher, AgentsStepDecoder]:
        """A multi-agent session: every declared agent must be one of the served model's, with its spaces."""
        if hello.HasField("observation_space") or hello.HasField("action_space"):
            raise BadRequest(
                "a multi-agent hello declares spaces per agent (hello.agents): leave observation_space and "
                "action_space unset",
            )
        agent_spaces = {}
        budget = codec.SpaceBudget()  # for all the agents' spaces together
        for i, agent in enumerate(hello.agents):
            if not agent.agent_id or agent.agent_id in agent_spaces or agent.agent_id == "__all__":
                raise BadRequest(f"hello.agents[{i}]: agent_id {agent.agent_id!r} is empty, reserved or declared twice")
            if not agent.HasField("observation_space") or not agent.HasField("action_space"):
                raise BadRequest(f"hello.agents[{i}] ({agent.agent_id!r}) needs both spaces")
            agent_spaces[agent.agent_id] = (
                codec.space_from_proto(agent.observation_space, f"hello.agents[{i}].observation_space", budget),
                codec.space_from_proto(agent.action_space, f"hello.agents[{i}].action_space", budget),
            )
        spec = MultiAgentSessionSpec(
            client_id=hello.client_id, agent_spaces=agent_spaces, num_envs=hello.num_envs, explore=hello.explore
        )
        try:
            policy, batcher = await self.host.for_session(spec)
        except ValueError as exc:  # as for a single-agent hello: no model can be built for these spaces
            raise BadRequest(f"no model for the hello's spaces: {exc}") from exc
        for agent_id, spaces in agent_spaces.items():
            served = policy.agent_spaces.get(agent_id)
            if served != spaces:
                known = ", ".join(policy.agent_spaces)
                raise WrongState(
                    f"agent {agent_id!r}: the served model has "
                    + (f"spaces {served}, the client {spaces}" if served else f"no such agent (agents: {known})"),
                )
        sampling, multi_agent = policy.spec.sampling, policy.spec.multi_agent
        assert multi_agent is not None and policy.mapping_fn is not None  # a multi-agent policy's
        session = MultiAgentSession(
            spec,
            mapping_fn=policy.mapping_fn,
            rollout_fragment_length=sampling.rollout_fragment_length
            if sampling.batch_mode == "truncate_episodes"
            else None,
            count_steps_by=multi_agent.count_steps_by,
            lookback=sampling.episode_lookback_horizon,
            write_back=policy.write_back,
        )
        self.sessions[session.id] = session
        self.metrics.sessions.set(len(self.sessions))
        log.info("multi-agent session opened session=%s client=%r agents=%r num_envs=%d", session.id,
                 spec.client_id, list(agent_spaces), spec.num_envs)  # fmt: skip
        observation_spaces = {agent: spaces[0] for agent, spaces in agent_spaces.items()}
        decoder = AgentsStepDecoder(
            observation_spaces, spec.num_envs, allow_non_finite_obs=self.settings.allow_non_finite_obs
        )
        return session, batcher, decoder

    async def _multi_agent_step(
        self, session: Session | MultiAgentSession, batcher: Batcher, decoder: AgentsStepDecoder, step: pb.Step
    ) -> pb.ServerMessage:
        """Decode the sub-envs' agent steps, record them, wait for the batch, answer the acting agents."""
        assert isinstance(session, MultiAgentSession)  # opened with its AgentsStepDecoder
        steps = decoder.decode(step)
        episodes, completed = session.observe(steps)
        outputs = await batcher.compute(None, episodes, session.spec.explore, alone=self._lone_session())
        self.router.ship(session.record(outputs), session.spec.explore)
        reply = pb.ServerMessage(
            actions=pb.Actions(
                agents=encode_agent_actions(outputs[Columns.ACTIONS_FOR_ENV]), model_version=batcher.core.version
            )
        )
        self.metrics.env_steps.inc(completed)
        return reply

    def _end(self, session: Session | MultiAgentSession) -> None:
        self.router.ship(session.close(), session.spec.explore)
        self.sessions.pop(session.id, None)
        self.metrics.sessions.set(len(self.sessions))
        if not self.sessions:
            self._no_sessions.set()
        log.info("session closed session=%s client=%r", session.id, session.spec.client_id)

    async def abort(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
        """End the stream with this status (its message bounded, counted by code, logged)."""
        message = bounded(message)
        self.metrics.rejected.labels(code.name).inc()
        log.info("rejected code=%s peer=%s message=%r", code.name, context.peer(), message)  # it may quote the client
        try:  # sent after the answers the client has not taken: a client that takes none holds it for ever
            async with asyncio.timeout(self.settings.idle_timeout_s):
                await context.abort(code, message)
        except TimeoutError:
            log.info("status not taken in %g s peer=%s: stream left", self.settings.idle_timeout_s, context.peer())


async def _write(context: grpc.aio.ServicerContext, stream: _Stream, message: pb.ServerMessage) -> None:
    """Write an answer, with the stream's idle clock running: it waits until the client takes it."""
    idle = stream.idle
    assert idle is not None
    idle.waiting_since, stream.writing = idle.now(), True
    await context.write(message)
    idle.waiting_since, stream.writing = None, False


def bounded(message: str) -> str:
    """The message, cut to MAX_DETAILS bytes of UTF-8 (at a character) and saying how much was left out."""
    data = message.encode()
    if len(data) <= MAX_DETAILS:
        return message
    kept = data[:MAX_DETAILS].decode(errors="ignore")
    return f"{kept}... ({len(message) - len(kept)} more characters)"


def _parse(message_type: type[M], raw: bytes) -> M:
    try:
        return from_bytes(message_type, raw)
    except NotAMessage as exc:
        raise BadRequest(str(exc)) from exc
