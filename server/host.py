"""PolicyHost: the policy a server serves, and the batcher in front of it.

The policy comes from one of three places, once: a checkpoint (`--checkpoint`), a fresh model of the operator's
run spec (built at start when the spec names an env, else for the first session's spaces), or the learner's first
weights (which carry the learner's run spec). After that it only takes newer weights from the learner, between
two batches. A run spec this server may not serve (code it may not import, another spec than the one it serves)
is refused: it serves nothing, or keeps the old version, and says why (`refused`). Whatever it serves, it hands
to its local-inference clients too (`relay`): the learner's Weights messages as they come, or its own policy's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import gymnasium as gym

from rlgate.core.spaces import flat_size
from rlgate.episodes.session import SessionSpec
from rlgate.policy.acting import ActingCore
from rlgate.policy.published import acts_only_newest, core_from_weights, spec_of, swap_weights, weights_message
from rlgate.server.batcher import Batcher
from rlgate.server.errors import NotServing, OverLimit, WrongState
from rlgate.server.metrics import ServerMetrics
from rlgate.server.multi_agent_batcher import MultiAgentBatcher
from rlgate.server.multi_agent_session import MultiAgentSessionSpec
from rlgate.server.relay import WeightsRelay
from rlgate.server.settings import ServerSettings
from rlgate.spec.env import agent_spaces, env_spaces
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import spaces_by_agent
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)

SERVES_MULTI_AGENT = (
    "this server serves a multi-agent run: declare the env's agents in hello.agents (rlgate env: a PettingZoo env "
    "and a run spec with [multi_agent])"
)
SERVES_SINGLE_AGENT = "this server serves a single-agent run: a multi-agent client needs a run spec with [multi_agent]"


class Pacing(Protocol):
    """What tells the batcher to pause (the learner's pace, a full spool) and to flush the sessions meanwhile."""

    def waiting_for_acks(self) -> bool: ...

    def backlogged(self) -> bool: ...

    def flush(self) -> None: ...


class PolicyHost:
    """Builds the served ActingCore and its batcher, hands them to sessions, and swaps in the learner's weights."""

    def __init__(
        self,
        settings: ServerSettings,
        metrics: ServerMetrics,
        spec: RunSpec | None,
        *,
        learner: bool,
        pacing: Pacing,
        relay: WeightsRelay,
    ) -> None:
        """`spec`: the operator's run spec (a fresh model's, or the learner's given in advance), None with a
        checkpoint or when the learner's weights bring it; `learner`: weights come from a learner; `relay`: what
        local-inference clients act with."""
        self.settings = settings
        self.metrics = metrics
        self.relay = relay
        self.spec = spec
        self.imports = ImportPolicy([*settings.allow_import, *(spec.modules() if spec else ())])
        self.learner = learner
        self.pacing = pacing
        self.core: ActingCore | None = None
        self.batcher: Batcher | None = None
        self.from_learner = False  # the served weights came from the learner (not a version 0 built here)
        self.refused: str | None = None  # why this server will not serve the learner's run spec
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Serve the checkpoint, or a fresh model of a run spec that names its env (its spaces are known now)."""
        s = self.settings
        if s.checkpoint:
            found = checkpoint.load(s.checkpoint)
            weights = found.module_weights if found.spec.multi_agent else found.weights
            with found.loading_weights():
                core = await self._build(
                    found.spec,
                    found.observation_space,
                    found.action_space,
                    weights=weights,
                    module_versions=found.module_versions,
                    connector_state=found.connector_state,
                    version=found.version,
                )
            await self._serve_own(core)
        elif self.spec is not None and "env" in self.spec.model_fields_set:
            spaces: tuple[gym.Space, gym.Space]
            if self.spec.multi_agent:
                spaces = spaces_by_agent(agent_spaces(self.spec.env, self.imports))
            else:
                spaces = env_spaces(self.spec.env, self.imports)
            await self._serve_own(await self._build(self.spec, *spaces))

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()

    async def for_session(self, session: SessionSpec | MultiAgentSessionSpec) -> tuple[ActingCore, Batcher]:
        """The served core and batcher for a new session; without a policy yet, a fresh model for the first
        session's spaces (of bounded size; later hellos wait for it, while the event loop goes on serving)."""
        multi_agent = isinstance(session, MultiAgentSessionSpec)
        async with self._lock:
            if self.core is None and self.learner:
                raise NotServing(self.refused or "no model yet: waiting for the learner's first weights")
            if self.core is None:
                assert self.spec is not None
                self._check_kind(multi_agent, bool(self.spec.multi_agent))
                await self._serve_own(await self._build(self.spec, *self._fresh_spaces(session)))
        assert self.core is not None and self.batcher is not None
        self._check_kind(multi_agent, self.core.multi_agent)
        return self.core, self.batcher

    @staticmethod
    def _check_kind(multi_agent: bool, served: bool) -> None:
        if multi_agent != served:
            raise WrongState(SERVES_MULTI_AGENT if served else SERVES_SINGLE_AGENT)

    def _fresh_spaces(self, session: SessionSpec | MultiAgentSessionSpec) -> tuple[gym.Space, gym.Space]:
        """The env spaces a session's hello declares, each at most --max-fresh-space-size values when flattened."""
        spaces: tuple[gym.Space, gym.Space]
        if isinstance(session, MultiAgentSessionSpec):
            spaces = spaces_by_agent(session.agent_spaces)
        else:
            spaces = (session.observation_space, session.action_space)
        limit = self.settings.max_fresh_space_size
        for name, space in zip(("observation_space", "action_space"), spaces, strict=True):
            size = flat_size(space)
            if size > limit:
                raise OverLimit(
                    f"hello.{name}: {size} values when flattened; this server builds a fresh model for at most "
                    f"{limit} (its --max-fresh-space-size)"
                )
        return spaces

    async def _build(
        self, spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, **source: Any
    ) -> ActingCore:
        """The spec's acting core for these env spaces (Dicts by agent id when multi-agent); `source`: weights,
        version, ... if any."""
        return await self._built(ActingCore.build, spec, observation_space, action_space, **source)

    async def _built(self, build: Callable[..., ActingCore], *args: Any, **source: Any) -> ActingCore:
        """`build(*args, imports, ...)` with this server's device, seed and stage counters, on a worker thread: a
        large model takes seconds, and the event loop serves /healthz meanwhile."""
        s = self.settings
        return await asyncio.to_thread(
            build,
            *args,
            self.imports,
            device=s.device,
            seed=s.seed,
            stage_seconds=self.metrics.stage_seconds,
            backend=s.backend,
            **source,
        )

    async def _serve_own(self, core: ActingCore) -> None:
        """Serve a policy built here (not the learner's weights), and relay it to local-inference clients (its
        weights taken before any batch runs, off the event loop: a large model's take a while)."""
        weights = await asyncio.to_thread(weights_message, core)
        self._serve(core)
        await self.relay.publish(weights)

    def _serve(self, core: ActingCore) -> None:
        """Serve `core` from now on, through a batcher of its own."""
        self.core = core
        self.metrics.model_version.set(core.version)
        s = self.settings
        self.batcher = (MultiAgentBatcher if core.multi_agent else Batcher)(
            core,
            waiting_for_acks=self.pacing.waiting_for_acks,
            flush=self.pacing.flush,
            backlogged=self.pacing.backlogged,
            max_batch_size=s.max_batch_size,
            metrics=self.metrics,
            thread=s.device == "cuda" if s.inference_thread is None else s.inference_thread,
        )
        self.batcher.start()
        log.info("model ready observation_space=%s action_space=%s", core.observation_space, core.action_space)

    def pause_reason(self) -> str | None:
        """Why sampling is paused now (see Batcher.pause_reason), if it is."""
        return self.batcher.pause_reason() if self.batcher else None

    def wake(self) -> None:
        """Look again whether to pause (the learner made room)."""
        if self.batcher is not None:
            self.batcher.wake()

    def learner_version(self) -> int:
        """The learner's version served now, or -1 (nothing from the learner yet): where WatchWeights resumes."""
        return self.core.version if self.core is not None and self.from_learner else -1

    async def connector_delta(self) -> dict[str, Any]:
        """The served pipeline's statistics since the last call (taken between batches), for the learner."""
        if self.core is None or self.batcher is None:
            return {}
        return await self.batcher.between_batches(self.core.take_connector_delta)

    async def apply_weights(self, weights: learner_pb2.Weights) -> bool:
        """A new version from the learner: the first builds the core from the learner's run spec, later ones swap
        weights between batches. False (and `refused` says why) when this server will not serve them."""
        try:
            spec = spec_of(weights, "the learner's run spec")
        except SpecError as exc:
            return self._refuse(str(exc))
        if self.core is None:
            try:
                core = await self._built(core_from_weights, weights, spec)
            except SpecError as exc:
                return self._refuse(str(exc))
            async with self._lock:
                self._serve(core)
        elif spec != self.core.spec:
            return self._refuse(
                "the learner now runs another run spec than the one this server was built for: restart this "
                "server to serve it (it keeps serving the old version meanwhile, and sends the learner no episodes)"
                if self.from_learner
                else "the learner runs another run spec than --config's: restart this server without --config, or "
                "with the learner's run spec (meanwhile it sends the learner no episodes, so sampling pauses once the "
                "learner's window of steps is spooled)"
            )
        elif self.batcher is not None:
            rebinding = await self.batcher.between_batches(self._swap, weights)
            if rebinding is not None:  # onnxruntime: act with the new sessions once they are built
                self.batcher.hold(acts_only_newest(spec))
                try:
                    await asyncio.wrap_future(rebinding)
                    await self.batcher.between_batches(self.core.take_rebound)
                finally:
                    self.batcher.hold(False)
            self.metrics.model_version.set(self.core.version)
        self.from_learner, self.refused = True, None  # (a learner that came back with the spec served)
        await self.relay.publish(weights)
        return True

    def _swap(self, weights: learner_pb2.Weights) -> Future | None:
        """Act with a newer version's weights and connector state (between batches)."""
        assert self.core is not None
        return swap_weights(self.core, weights)

    def _refuse(self, reason: str) -> bool:
        """Serve nothing of the learner's (or keep the old version) and say why; False, for `apply_weights`."""
        if reason != self.refused:
            log.error("not serving the learner's weights: %s", reason)
        self.refused = reason
        return False
