"""Local inference: an env client that acts with its server's policy itself and sends the server its episodes.

At one env per message, a round trip to a Python server for every action costs far more than the action: the
client acts itself instead (`EnvClient(..., inference="local")`, `rlgate env --inference local`). Only two streams
go to the server, one address as before:

- `PolicyService.WatchWeights`: the weights the server serves (its learner's, relayed, or its own policy's): the
  run spec, the env's spaces, safetensors and connector state. The first builds the same `ActingCore` a server
  acts with (code the spec names is imported only from the modules the operator allowed, as a server's), its
  forward pass in torch or onnxruntime as the client's `backend` says (a server's `--backend`); each newer
  version is swapped in between two steps, so stepping never waits for it (onnxruntime's sessions for it are
  built on a worker thread meanwhile).
- `PolicyService.SubmitEpisodes`: the episodes, recorded as a server session records them (`episodes.session`:
  log-probabilities, action distribution inputs, values, model versions, cut every rollout_fragment_length steps),
  with the connector statistics gathered since the last batch (MeanStdFilter), through a spool on disk
  (`delivery`): a batch is deleted only once the server acknowledged it, which it does once it holds it on disk,
  and every unacknowledged one is sent again on a new stream (the learner drops chunks it has already). Nothing is
  lost when the server or the learner restarts, nothing trains twice.

Pacing is the learner's, as for a server: the client pauses sampling (and ships its running episodes) while it holds
its share of the server's window of unacknowledged env steps (the weights' `max_unacked_steps`), or more steps than
the learner's next update still needs (the acks' `room`); the server acknowledges only as the learner takes what it
holds. Its spool is bounded too: once full, sampling waits. A client that does not explore (an evaluation) sends no
episodes. Multi-agent runs are served-side only.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import re
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import grpc
import gymnasium as gym
import numpy as np

from rlgate.client.connection import RETRYABLE, ServerRefused, Tally, no_model_yet
from rlgate.core.columns import Columns
from rlgate.core.errors import UserError
from rlgate.core.space_diff import space_differences
from rlgate.delivery.shipper import BatchShipper
from rlgate.delivery.spool import Spool
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.session import Session, SessionSpec
from rlgate.policy.acting import ActingCore
from rlgate.policy.published import acts_only_newest, core_from_weights, spec_of, swap_weights
from rlgate.spec.imports import ImportPolicy
from rlgate.v1 import learner_pb2, policy_pb2_grpc
from rlgate.v1 import policy_pb2 as pb

if TYPE_CHECKING:
    from rlgate.client.env_client import EnvClient

log = logging.getLogger(__name__)

SUBMIT = "/rlgate.v1.PolicyService/SubmitEpisodes"
# Why sampling waits (`ServerLink.held`).
WAITING_FOR_ACKS = "waiting for the server to take the steps shipped"
SPOOL_FULL = "spool full: waiting for the server"


async def act_locally(client: EnvClient, max_steps: int) -> None:
    """Step `client.env` with actions of the server's policy, acting here, until `max_steps` or `client.stop()`."""
    link = ServerLink(client)
    try:
        if not await client.connected(link.channel):
            return  # stopped while waiting
        link.start()
        core = await link.first_core()
        if core is not None:
            await _act(client, link, core, max_steps)
    finally:
        await link.stop()


async def _act(client: EnvClient, link: ServerLink, core: ActingCore, max_steps: int) -> None:
    """The step loop: observe into the session, act, record (shipping the chunks due), step the env."""
    env, explore = client.env, client.explore
    assert isinstance(env, gym.vector.VectorEnv)  # inference local takes single-agent envs (EnvClient checks)
    n = env.num_envs
    sampling = core.spec.sampling
    session = Session(
        SessionSpec(client.client_id, env.single_observation_space, env.single_action_space, n, explore),
        rollout_fragment_length=sampling.rollout_fragment_length
        if sampling.batch_mode == "truncate_episodes"
        else None,
        lookback=sampling.episode_lookback_horizon,
        ships=explore,
        observation_spaces=[piece.observation_space for piece in core.env_to_module.connectors],
    )
    obs, _ = env.reset(seed=client.seed)
    client.seed = None  # a later run continues the env's RNG instead of replaying the same episodes
    rewards, terminateds, truncateds = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
    tally = Tally(client.stats, n)
    try:
        while True:
            if explore and link.held(session.unshipped_steps()) and not await link.paced(session):
                return  # stopped while paused
            await link.apply_newest(core)  # after a pause: the version that came meanwhile
            episodes, _ = session.observe(obs, rewards, terminateds, truncateds, None)
            outputs = core.act(episodes, explore, obs)
            link.ship(session.record(outputs))
            client.stats.model_version = core.version
            if client.done(max_steps):  # the last step's outcome is recorded, as a server records it
                return
            obs, rewards, terminateds, truncateds, _ = env.step(outputs[Columns.ACTIONS_FOR_ENV])
            tally.step(rewards, terminateds, truncateds)
            client.stepped()
            await asyncio.sleep(0)  # acks and weights come in between two steps
    finally:
        link.ship(session.close())  # running episodes, cut off as truncated


class ServerLink:
    """A local-inference client's two streams to its server: weights in, episodes out (spooled until acknowledged),
    and the pace they set; both move to a new channel through the same target when the server hands the client
    over (`_move`)."""

    def __init__(self, client: EnvClient) -> None:
        self.channel = client.channel()
        self.client = client
        self.core: ActingCore | None = None
        self.weights: learner_pb2.Weights | None = None  # the newest version received, until it is acted with
        self.spec_json = ""  # the run spec acted with, as its weights carried it
        self.window = 0  # this client's share of the server's unacknowledged env steps (0: no limit)
        self.room: int | None = None  # env steps the learner still takes before its next update, from the last ack
        self.failure: Exception | None = None  # what ends run(): a stream the server refused for good
        self._version = -1  # the newest version received
        self._changed = asyncio.Event()  # weights, an ack or a failure came
        self._may_send = asyncio.Event()  # the run spec acted with is known: the hello may name it
        self._settled = asyncio.Event()  # no handover under way: the episode stream may open
        self._settled.set()
        self._handover = asyncio.Event()  # the server handed this client over: the episode stream is to end
        self._idle = asyncio.Event()  # no episode stream open
        self._idle.set()
        self._tasks: list[asyncio.Task] = []
        self._lock: IO | None = None
        self.shipper: BatchShipper | None = None
        if client.explore:
            directory, self._lock = claim_spool(client.spool_dir, client.client_id)
            spool = Spool(directory, max_bytes=client.max_spool_bytes)
            self.shipper = BatchShipper(
                spool, sender_id=client.client_id, connector_delta=self._connector_delta, on_ack=self._acked
            )

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._retry(self._watch), name="weights-watcher")]
        if self.shipper is not None:
            if self.shipper.spool.files():
                log.info("spool holds %d batches from before: sending them first", len(self.shipper.spool.files()))
            self.shipper.start()
            self._tasks.append(loop.create_task(self._retry(self._send), name="episode-sender"))

    async def stop(self) -> None:
        """Give the server `drain_timeout_s` to take what is spooled (what it does not take is sent at the next start
        with this client id), then stop."""
        if self.shipper is not None and self.failure is None and self.core is not None:  # a stream may take them
            await self.shipper.drain(self.client.drain_timeout_s, f"the server at {self.client.target}")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shipper is not None:
            await self.shipper.stop()
        if self._lock is not None:
            self._lock.close()
        await self.channel.close()

    async def first_core(self) -> ActingCore | None:
        """The acting core of the server's first weights, once they come (None: stopped before)."""
        if not await self._until(lambda: self.weights is not None):
            return None
        weights, self.weights = self.weights, None
        assert weights is not None
        client = self.client
        spec = spec_of(weights, f"the run spec of the server at {client.target}")
        if spec.multi_agent is not None:
            raise UserError(
                f"the server at {client.target} serves a multi-agent run: inference local acts in single-agent runs"
            )
        imports = ImportPolicy(client.allow_import)
        core = await asyncio.to_thread(
            core_from_weights, weights, spec, imports, seed=client.seed, backend=client.backend
        )
        env = client.env
        assert isinstance(env, gym.vector.VectorEnv)  # inference local takes single-agent envs (EnvClient checks)
        differences = space_differences(
            core.observation_space, env.single_observation_space, "observation_space"
        ) + space_differences(core.action_space, env.single_action_space, "action_space")
        if differences:
            raise UserError(
                f"the env's spaces must equal those of the model the server at {client.target} serves; they differ "
                "in (server != client): " + "; ".join(differences)
            )
        self.core, self.spec_json = core, weights.spec_json
        client.stats.backend = "torch" if core.onnx is None else "onnxruntime"
        self._may_send.set()
        return core

    async def apply_newest(self, core: ActingCore) -> None:
        """Act with the newest version received, if newer (between two steps); raise what ended a stream for good.

        An onnxruntime core builds the new version's sessions on a worker thread while the old ones act, and acts
        with them from the first step after they are done (or waits for them where the run's sampling and
        training take turns), as a server does."""
        if self.failure is not None:
            raise self.failure
        core.take_rebound()
        weights = self.weights
        if weights is None:
            return
        self.weights = None
        if weights.spec_json != self.spec_json and spec_of(weights, "the server's run spec") != core.spec:
            raise UserError(
                f"the server at {self.client.target} now serves another run spec: restart this client to act with it"
            )
        rebinding = swap_weights(core, weights)
        if rebinding is not None and acts_only_newest(core.spec):
            await asyncio.wrap_future(rebinding)
            core.take_rebound()

    def ship(self, chunks: list[Chunk]) -> None:
        if self.shipper is not None:
            self.shipper.ship(chunks)

    def held(self, unshipped: int) -> str | None:
        """Why sampling waits now, if it does: this client holds more steps than the server last granted it of the
        learner's room (`unshipped`: those in running episodes), or, while no grant is known (before the server's
        first ack on a stream), its window of unacknowledged env steps; or its spool is full. The grant alone bounds
        it once known: it never exceeds the room, and stays as it was while no ack comes (the learner or the server
        away), while the window, shared among many clients, is a few steps each and would make each pause ship a
        batch of a few steps (4 clients of one env: 3,700 env steps/s instead of 2,200, training). A grant of
        nothing still lets it take a step and ship it: only an ack says when the learner has room again."""
        shipper = self.shipper
        if shipper is None:
            return None
        unacked = shipper.unacked_steps()
        if self.room is not None:
            if unacked + unshipped > self.room:
                return WAITING_FOR_ACKS
        elif 0 < self.window <= unacked:
            return WAITING_FOR_ACKS
        return SPOOL_FULL if shipper.spool.full() else None

    async def paced(self, session: Session) -> bool:
        """Wait while sampling is held, shipping the running episodes while the server is to take them (so that
        the learner gets the newest steps); False when the client stopped meanwhile."""
        stats = self.client.stats
        try:
            while True:
                self._changed.clear()  # before looking: what comes from here on wakes the wait below
                stats.paused = self.held(session.unshipped_steps())
                if stats.paused is None:
                    return True
                if stats.paused is WAITING_FOR_ACKS and self.shipper is not None:
                    self.ship(session.flush())
                    await self.shipper.write_now()  # the acks are what sampling waits for: no write interval
                if not await self._next_change():
                    return False
        finally:
            stats.paused = None

    async def _until(self, condition: Callable[[], bool]) -> bool:
        """Wait until `condition()` (True) or the client stops (False); raise what ended a stream for good."""
        while True:
            self._changed.clear()  # before looking: what comes from here on wakes the wait below
            if condition():
                return True
            if not await self._next_change():
                return False

    async def _next_change(self) -> bool:
        """Wait for weights, an ack or a failure since `_changed` was last cleared (True; a failure raises) or for
        the client to stop (False)."""
        if self.failure is not None:
            raise self.failure
        stopping = self.client.stopping()
        changed = asyncio.ensure_future(self._changed.wait())
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            stopped.cancel()
        if self.failure is not None:
            raise self.failure
        return not stopping.is_set()

    async def _connector_delta(self) -> dict[str, Any]:
        """The statistics gathered since the last batch (taken between two steps: the step loop runs on this loop)."""
        return self.core.take_connector_delta() if self.core is not None else {}

    def _acked(self, ack: learner_pb2.EpisodeAck, path: Path | None) -> None:
        if path is None or self.shipper is None:
            return
        self.shipper.spool.ack(ack.seq, path)
        self.room = ack.room if ack.HasField("room") else None
        self._changed.set()

    async def _watch(self) -> None:
        """One WatchWeights stream: keep the newest version for the step loop. Its end (OK) is the server handing
        this client over."""
        client = self.client
        request = learner_pb2.WatchWeightsRequest(server_id=client.client_id, after_version=self._version)
        stub = policy_pb2_grpc.PolicyServiceStub(self.channel)
        async for weights in stub.WatchWeights(request, metadata=client.metadata, wait_for_ready=True):
            self._version = weights.version
            self.window = weights.max_unacked_steps
            self.weights = weights
            self._changed.set()
        await self._move()

    async def _move(self) -> None:
        """The server ended the weights stream: it hands this client over (its max session age, or it is stopping).
        The episode stream sends nothing more and ends once what it sent is acknowledged (nothing lost, nothing
        twice; stepping goes on meanwhile, into the spool), then both streams open again on a new channel through
        the same target, which may reach another replica (proto/README.md, "Moving to another replica")."""
        self.client.stats.handovers += 1
        self._settled.clear()  # no episode stream opens until the move is done
        self._handover.set()
        await self._idle.wait()  # (within drain_timeout_s: the stream waits no longer for its acks)
        old, self.channel = self.channel, self.client.channel()
        await old.close()
        self._handover.clear()
        self._settled.set()

    async def _send(self) -> None:
        """One SubmitEpisodes stream: the hello naming the run spec acted with, then every spooled batch in order."""
        await self._may_send.wait()
        await self._settled.wait()
        self._idle.clear()  # (no await since the move was known settled: none begins while this stream opens)
        assert self.shipper is not None
        client = self.client
        try:
            call = self.channel.stream_stream(
                SUBMIT, request_serializer=None, response_deserializer=learner_pb2.EpisodeAck.FromString
            )(metadata=client.metadata, wait_for_ready=True)
            hello = pb.SubmitHello(client_id=client.client_id, spec_json=self.spec_json, num_envs=client.env.num_envs)
            await call.write(pb.EpisodeSubmission(hello=hello).SerializeToString())
            # The server's initial metadata says it accepted the hello; a refused stream ends here with its own
            # status (a batch written after the refusal could replace it with gRPC's INTERNAL, grpc/grpc#36066).
            await call.initial_metadata()
            if call.done():
                await call.read()  # raises the refusal's status
            await self.shipper.stream(call, _submission, self._handover, client.drain_timeout_s)
        finally:
            self.room = None  # unknown until the next stream's first ack: meanwhile only the window holds sampling
            self._idle.set()

    async def _retry(self, stream: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a stream forever, re-opening it when it breaks (with backoff while it keeps failing); a status that a
        new stream would get too ends run() (`failure`)."""
        backoff, said = 0.05, ""
        while True:
            started = time.monotonic()
            try:
                await stream()
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    return self._fail(ServerRefused(self.client.target, exc.code(), exc.details()))
                reason = f"{stream.__name__}: {exc.code().name}: {exc.details()}"
                if reason != said:  # once per reason, not once per try; no model yet is start-up, not a fault
                    level = logging.INFO if no_model_yet(exc) else logging.WARNING
                    log.log(level, "server %s: stream %s; reopening it", self.client.target, reason)
                    said = reason
            except asyncio.InvalidStateError:  # grpc.aio's error for a write after the stream ended: it broke
                pass
            except Exception as exc:  # never let a stream die silently: run() would wait for it for ever
                return self._fail(exc)
            if time.monotonic() - started > self.client.max_backoff_s:
                backoff = 0.05
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.client.max_backoff_s)

    def _fail(self, exc: Exception) -> None:
        self.failure = exc
        self._changed.set()


def _submission(data: bytes) -> bytes:
    """A spooled EpisodeBatch as a SubmitEpisodes message."""
    message = pb.EpisodeSubmission()
    message.batch.MergeFromString(data)
    return message.SerializeToString()


def claim_spool(base: Path, client_id: str) -> tuple[Path, IO]:
    """The spool folder of `client_id` under `base`, locked by this process (the lock file, held open): another
    process with the same id (two `rlgate env` runs with the same env) gets `<id>-2`, and so on, so that no two
    processes share a spool; a process that died left its lock free, and whoever takes its folder next sends its
    batches."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", client_id)
    for n in range(1, 1000):
        directory = base / (name if n == 1 else f"{name}-{n}")
        directory.mkdir(parents=True, exist_ok=True)
        lock = (directory / ".lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return directory, lock
    raise UserError(f"--spool-dir {base}: 999 clients named {client_id} hold spools there")
