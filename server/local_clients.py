"""LocalClients: the env clients that act with this server's policy themselves (`rlgate env --inference local`).

Such a client watches the weights this server relays (`PolicyService.WatchWeights`: `weights_after`), builds the same
acting core from them, records its episodes as a server session would, and sends them in batches
(`PolicyService.SubmitEpisodes`: `open`, then `take` per batch). Each batch joins this server's delivery path
(`ShippingRouter.relay`: the episode files, the learner's spool) once the learner's pace allows, and is acknowledged
then, with what it may still sample of the room the learner has left (`EpisodeAck.room`, `_grant`): a client that
keeps to its share of the window of unacknowledged steps (the relayed `max_unacked_steps`) and to that room samples
at the learner's pace, as a session does. A batch of another run is refused: a client names the run spec it acts
with in its hello, and its chunks must hold observations as the served pipeline leaves them. What each client sent
last (its model version, how far that is behind the served one, its env steps) is what /status, the metrics and the
page show of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from rlgate.core import codec
from rlgate.policy.acting import ActingCore
from rlgate.policy.published import MAX_VERSION
from rlgate.server.errors import BadRequest, NotServing, OverLimit, WrongState
from rlgate.server.host import PolicyHost
from rlgate.server.metrics import ServerMetrics
from rlgate.server.relay import WeightsRelay
from rlgate.server.router import ShippingRouter
from rlgate.spec.imports import SpecError
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2
from rlgate.v1 import policy_pb2 as pb

if TYPE_CHECKING:
    from rlgate.policy.published_onnx import OnnxWeights

log = logging.getLogger(__name__)

# Longest client id (Hello.client_id, SubmitHello.client_id), in characters: it is logged and listed in /status.
MAX_CLIENT_ID = 256
MAX_LISTED = 200  # local clients listed in /status


@dataclass
class LocalClient:
    """One SubmitEpisodes stream after its hello, and what it sent so far."""

    client_id: str
    num_envs: int
    spec: RunSpec
    opened: float = field(default_factory=time.monotonic)
    model_version: int | None = None  # the newest model version that chose a step it sent
    granted: int = 0  # env steps of the learner's room its last ack granted it, less what it sent since
    env_steps: int = 0
    batches: int = 0
    last_batch: float | None = None  # monotonic time


class LocalClients:
    """Relays weights to local-inference clients and takes their batches into the server's delivery path."""

    def __init__(
        self, host: PolicyHost, router: ShippingRouter, relay: WeightsRelay, metrics: ServerMetrics, *, limit: int
    ) -> None:
        """`limit`: the most clients sending episodes at once (the server's --max-sessions)."""
        self.host = host
        self.router = router
        self.relay = relay
        self.metrics = metrics
        self.limit = limit
        self.clients: dict[int, LocalClient] = {}
        self.env_steps = 0  # env steps taken in from local clients since start
        self._spaces: dict[bytes, gym.Space] = {}  # batch observation spaces found good, by their wire bytes
        self._spaces_of: ActingCore | None = None  # the served core they were checked against
        self._onnx: OnnxWeights | None = None  # the served run's ONNX files, for clients that ask for them
        self._exporting = asyncio.Lock()
        metrics.local_clients.set_function(lambda: len(self.clients))
        metrics.local_staleness.set_function(lambda: max(self.staleness().values(), default=0))

    # --- WatchWeights ---------------------------------------------------------------------------------------

    def weights_after(self, request: learner_pb2.WatchWeightsRequest) -> AsyncIterator[learner_pb2.Weights]:
        """Every version above request.after_version, as this server relays them (its newest first)."""
        if not -1 <= request.after_version < MAX_VERSION:
            raise BadRequest(
                f"after_version {request.after_version} is out of range: -1 (none yet) or a version below 2**62"
            )
        if len(request.server_id) > MAX_CLIENT_ID:
            raise BadRequest(f"server_id (the client's id): {len(request.server_id)} characters > {MAX_CLIENT_ID}")
        if self.relay.weights is None and not self.host.learner:
            raise NotServing(
                "no model yet: this server builds its fresh model for the first server-side session's spaces "
                "(name the env in its run spec to build it at start)"
            )
        if request.onnx:
            return self._with_onnx(self.relay.after(request.after_version))
        return self.relay.after(request.after_version)

    async def _with_onnx(self, relayed: AsyncIterator[learner_pb2.Weights]) -> AsyncIterator[learner_pb2.Weights]:
        """Each relayed version with its ONNX file (`Weights.onnx`), for a client that acts with an ONNX runtime;
        WrongState for a run such a client cannot act in as a server would (`OnnxWeights` says why)."""
        from rlgate.export.pieces import NotExportable  # onnx and onnxruntime load only for such a client
        from rlgate.policy.published_onnx import OnnxWeights

        async for weights in relayed:
            async with self._exporting:  # one trace per run, however many clients ask at once
                exporter = self._onnx
                if exporter is None or exporter.spec_json != weights.spec_json:
                    try:
                        exporter = await asyncio.to_thread(OnnxWeights, weights, self.host.imports)
                    except (NotExportable, SpecError) as exc:
                        raise WrongState(f"no ONNX file for this run: {exc}") from exc
                    self._onnx = exporter
            with_file = learner_pb2.Weights()
            with_file.CopyFrom(weights)
            with_file.onnx = await asyncio.to_thread(exporter.file, weights)
            yield with_file

    # --- SubmitEpisodes -------------------------------------------------------------------------------------

    def open(self, hello: pb.SubmitHello) -> LocalClient:
        """A client that will send episodes sampled by the run spec its hello names: it must be the served one."""
        if len(hello.client_id) > MAX_CLIENT_ID:
            raise BadRequest(f"hello.client_id: {len(hello.client_id)} characters > {MAX_CLIENT_ID}")
        if hello.num_envs < 1:
            raise BadRequest("hello.num_envs must be at least 1")
        if len(self.clients) >= self.limit:
            raise OverLimit(f"server is full: {self.limit} local clients send episodes")
        if not self.router.ships(explore=True):
            raise WrongState(
                "this server keeps no episodes (no --learner, no --episode-dir): act without sending any (explore "
                "off), or connect to a server that trains"
            )
        core = self._served()
        try:
            spec = RunSpec.from_json(hello.spec_json, "hello.spec_json")
        except SpecError as exc:
            raise BadRequest(str(exc)) from exc
        if spec != core.spec:
            raise WrongState(
                "hello.spec_json is not the run spec this server serves: its episodes would train a model they were "
                "not sampled by (restart the client: it takes the served spec from WatchWeights)"
            )
        client = LocalClient(hello.client_id, hello.num_envs, core.spec)  # the served object: `take` checks identity
        self.clients[id(client)] = client
        log.info("local client opened client=%r num_envs=%d", client.client_id, client.num_envs)
        return client

    async def take(self, client: LocalClient, batch: learner_pb2.EpisodeBatch) -> learner_pb2.EpisodeAck:
        """One of the client's batches into the delivery path; its ack once it is there (on disk)."""
        core = self._served()
        if core.spec is not client.spec and core.spec != client.spec:
            raise WrongState("this server now serves another run spec: restart the client to act with it")
        steps, version = self._check(batch, core)
        seq, chunks = batch.seq, sum(len(table.ids) for table in batch.chunks)
        await self.router.relay(batch, steps, (self._observation_space(batch, core), core.action_space))
        client.granted = max(0, client.granted - steps)
        client.env_steps += steps
        client.batches += 1
        client.last_batch = time.monotonic()
        if version is not None:
            client.model_version = max(version, client.model_version if client.model_version is not None else -1)
        self.env_steps += steps
        self.metrics.local_env_steps.inc(steps)
        return learner_pb2.EpisodeAck(seq=seq, accepted=chunks, room=self._grant(client))

    def _grant(self, client: LocalClient) -> int | None:
        """The env steps `client` may hold (unacknowledged, or in its running episodes) before it pauses: of the room
        the learner's next update still needs beyond what this server holds, what no other client was granted and
        has yet to send, at most an even share of the learner's room. Together the clients then sample no more than
        the next update takes with this version, and a lone client takes the whole room at once. Each pause for a
        grant ships the client's running episodes cut short, so smaller grants (half shares: a lag of 1.45-1.5
        versions in tests/learner/test_pacing.py against 1.6) cost more than they save: CartPole through
        `rlgate up --inference local` took a median of 31.9k env steps to 475 over 6 seeds with half shares, 24.7k
        with even ones (20.5k acting on the server). None while the learner's room is unknown."""
        room, link = self.router.room(), self.router.learner
        if room is None or link is None or link.room is None:
            return None
        others = sum(other.granted for other in self.clients.values() if other is not client)
        client.granted = max(0, min(room - others, link.room // len(self.clients)))
        return client.granted

    def close(self, client: LocalClient) -> None:
        self.clients.pop(id(client), None)
        log.info("local client closed client=%r env_steps=%d", client.client_id, client.env_steps)

    def _served(self) -> ActingCore:
        """The served core, while its episodes go to the learner; else NotServing (UNAVAILABLE: try again later)."""
        if self.host.refused is not None:
            raise NotServing(self.host.refused)
        if self.host.core is None:
            raise NotServing("no model yet: waiting for the learner's first weights")
        return self.host.core

    def _check(self, batch: learner_pb2.EpisodeBatch, core: ActingCore) -> tuple[int, int | None]:
        """The batch's env steps and newest model version, after the checks a relay can make without decoding its
        columns (the learner decodes them, and refuses chunks that do not fit)."""
        if batch.episodes:
            raise BadRequest("batch.episodes: send chunks as EpisodeChunks tables (batch.chunks)")
        if not batch.chunks:
            raise BadRequest("batch.chunks: a batch holds at least one table of chunks")
        steps, versions = 0, []
        for i, table in enumerate(batch.chunks):
            if not table.ids or len(table.steps) != len(table.ids):
                raise BadRequest(f"batch.chunks[{i}]: {len(table.ids)} ids, {len(table.steps)} steps (one per chunk)")
            known = set(core.module) if core.multi_agent else {""}
            if table.module_id not in known:
                raise WrongState(f"batch.chunks[{i}].module_id {table.module_id!r}: the served run has no such module")
            steps += sum(table.steps)
            if table.HasField("model_versions") and table.model_versions.shape and table.model_versions.shape[0]:
                versions.append(int(codec.from_tensor(table.model_versions, f"batch.chunks[{i}].model_versions").max()))
        self._observation_space(batch, core)
        return steps, max(versions, default=None)

    def _observation_space(self, batch: learner_pb2.EpisodeBatch, core: ActingCore) -> gym.Space | None:
        """The space the batch's observations are in: one the served pipeline leaves them in (the env's, or a
        piece's output), else WrongState; where the batch does not say, the pipeline's output (a multi-agent run's:
        None). Each space is decoded and checked once per served core (a client sends the same one with every
        batch)."""
        if not batch.HasField("observation_space"):
            return None if core.multi_agent else core.env_to_module.observation_space
        if self._spaces_of is not core:
            self._spaces_of, self._spaces = core, {}
        wire = batch.observation_space.SerializeToString()
        space = self._spaces.get(wire)
        if space is None:
            space = codec.space_from_proto(batch.observation_space, "batch.observation_space")
            served = [core.observation_space, *(piece.observation_space for piece in core.env_to_module.connectors)]
            if not core.multi_agent and not any(space == known for known in served):
                raise WrongState(
                    f"batch.observation_space {space} is none the served run's env-to-module pipeline leaves "
                    f"observations in ({', '.join(dict.fromkeys(map(str, served)))}): chunks of another run"
                )
            if len(self._spaces) < MAX_LISTED:  # bounded: a client may send many another space
                self._spaces[wire] = space
        return space

    # --- what status shows ----------------------------------------------------------------------------------

    def staleness(self) -> dict[int, int]:
        """Per client that sent a step: how many versions its newest step's model is behind the served one."""
        core = self.host.core
        if core is None:
            return {}
        return {
            key: max(0, core.version - client.model_version)
            for key, client in self.clients.items()
            if client.model_version is not None
        }

    def status(self) -> dict[str, Any]:
        """The local clients for /status: how many watch the weights and send episodes, and each sender."""
        now, staleness = time.monotonic(), self.staleness()
        return {
            "watching_weights": self.relay.watchers,
            "sending_episodes": len(self.clients),
            "env_steps": self.env_steps,
            "clients": [
                {
                    "client_id": client.client_id,
                    "num_envs": client.num_envs,
                    "model_version": client.model_version,
                    "staleness": staleness.get(key),
                    "env_steps": client.env_steps,
                    "batches": client.batches,
                    "last_batch_s_ago": None if client.last_batch is None else round(now - client.last_batch, 1),
                }
                for key, client in list(self.clients.items())[:MAX_LISTED]
            ],
        }
