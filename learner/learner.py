"""The learner's domain object: episode intake, the training loop, weight publishing, checkpoints, status."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlgate.core import codec
from rlgate.learner.batch_decoder import BatchDecoder, DecodedBatch
from rlgate.learner.best_checkpoint import BestCheckpoint
from rlgate.learner.chunk_check import learner_output_shapes
from rlgate.learner.data_parallel import GroupFailed, fail
from rlgate.learner.device import learner_device
from rlgate.learner.intake import RETURN_WINDOW, Covered, Intake
from rlgate.learner.metrics import LearnerMetrics
from rlgate.learner.multi_agent_trainer import MultiAgentTrainer
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.progress import Progress
from rlgate.learner.servers import Servers
from rlgate.learner.settings import LearnerSettings
from rlgate.learner.trainer import Trainer
from rlgate.models import load_weights, weights_to_bytes
from rlgate.policy.published import MAX_VERSION
from rlgate.spec.algorithm import DQNConfig, PPOConfig, SACConfig
from rlgate.spec.build import build_env_to_module, build_learner_connector, build_rl_module
from rlgate.spec.env import run_spaces
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import (
    agent_spaces_of,
    build_multi_agent_env_to_module,
    build_multi_agent_learner_connector,
    build_multi_rl_module,
    episode_module_spaces,
    modules_to_train,
    pipeline_module_spaces,
)
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from rlgate.v1 import learner_pb2

log = logging.getLogger(__name__)


class Learner:
    """Takes episode chunks, trains on them, publishes every new version to the watching servers.

    Everything but the trainer's own work runs on the event loop: intake state, published weights
    and the counters are only ever touched there. Updates, weight snapshots and checkpoints run one at
    a time on the trainer thread.
    """

    trainer: Trainer | MultiAgentTrainer | OffPolicyTrainer

    def __init__(self, settings: LearnerSettings) -> None:
        self.settings = settings
        self.device = learner_device(settings)  # the module, its optimizers and the train batches live there
        self.metrics = LearnerMetrics()
        found = checkpoint.latest(settings.checkpoint_dir) if settings.resume else None
        ckpt = checkpoint.load(found) if found is not None else None
        given = settings.spec if settings.spec_given() else None
        # Code named by the operator's own spec may be imported; a checkpoint's only where allowed.
        self.imports = ImportPolicy([*settings.allow_import, *(given.modules() if given else ())])
        if ckpt is not None:
            log.info("resuming from checkpoint %s version=%d", found, ckpt.version)
            assert found is not None  # ckpt's directory
            self.observation_space, self.action_space = ckpt.observation_space, ckpt.action_space
            self.spec = ckpt.spec if given is None else resumable(ckpt, given, self.imports, found)
        elif given is None:
            raise SpecError(
                f"no checkpoint in {settings.checkpoint_dir} and no run spec: pass --config run.toml or --env ENV_ID"
            )
        else:
            self.spec = given
            self.observation_space, self.action_space = run_spaces(given.env, bool(given.multi_agent), self.imports)
        if self.spec.multi_agent:
            self._init_multi_agent(ckpt)
            return
        # The servers' env-to-module pipeline, here as the coordinator of their statistics (MeanStdFilter).
        self.connectors = build_env_to_module(self.spec, self.observation_space, self.action_space, self.imports)
        if ckpt is not None and ckpt.connector_state:
            self.connectors.set_state(ckpt.connector_state)
        assert self.connectors.observation_space is not None  # built on the env's space
        module = build_rl_module(self.spec, self.connectors.observation_space, self.action_space, self.imports)
        if ckpt is not None:
            with ckpt.loading_weights():
                load_weights(module, ckpt.weights)
        module.to(self.device).eval()
        pipeline = build_learner_connector(
            self.spec, module.observation_space, module.action_space, self.imports, device=str(self.device)
        )
        if isinstance(self.spec.algorithm, DQNConfig | SACConfig):  # OFF_POLICY
            self.trainer = OffPolicyTrainer(
                module,
                pipeline,
                self.spec.algorithm,
                seed=self.spec.seed,
                version=ckpt.version if ckpt else 0,
                env_steps=ckpt.env_steps if ckpt else 0,
                state=ckpt.learner_state if ckpt else None,
                buffer_state=self._replay_buffer(ckpt),
            )
        else:
            self.trainer = Trainer(
                module,
                pipeline,
                self.spec.algorithm,
                max_staleness=settings.max_staleness,
                seed=self.spec.seed,
                version=ckpt.version if ckpt else 0,
                optimizer_state=ckpt.optimizer_state if ckpt else None,
                env_steps=ckpt.env_steps if ckpt else 0,
            )
        # Chunks hold observations as the servers' write-back pieces left them: the env's, or some piece's output.
        pieces = [
            piece.observation_space for piece in self.connectors.connectors if piece.observation_space is not None
        ]
        self.intake = Intake(
            settings.checkpoint_dir / "intake",
            BatchDecoder(
                [self.connectors.observation_space, self.observation_space, *pieces],
                self.action_space,
                output_shapes={None: learner_output_shapes(module, self.spec.algorithm.name)},
                allow_nonfinite_obs=self.spec.env.allow_nonfinite_obs,
            ),
            trained=set(ckpt.trained_chunks if ckpt else ()),
            stale=set(ckpt.stale_chunks if ckpt else ()),
            partial=dict(ckpt.partial_chunks if ckpt else {}),
            resume=settings.resume,
            lookback=self.spec.sampling.episode_lookback_horizon,
            on_reject=lambda reason, chunks: self.metrics.rejected.labels(reason).inc(chunks),
        )
        self._init_service()

    def _replay_buffer(self, ckpt: checkpoint.Checkpoint | None) -> checkpoint.State | None:
        """The checkpoint's replay buffer to go on with, where the spec keeps buffers in checkpoints (RLlib's
        `store_buffer_in_checkpoints`); a mismatch either way is said in the log."""
        if ckpt is None:
            return None
        assert isinstance(self.spec.algorithm, DQNConfig | SACConfig)  # asked in off-policy runs only
        keep = self.spec.algorithm.store_buffer_in_checkpoints
        if keep and ckpt.replay_buffer is None:
            log.warning("store_buffer_in_checkpoints: %s holds no replay buffer; it starts empty", ckpt.directory)
        if not keep and ckpt.replay_buffer is not None:
            log.warning("%s holds a replay buffer, left unread: store_buffer_in_checkpoints is off", ckpt.directory)
        return ckpt.replay_buffer if keep else None

    def _init_multi_agent(self, ckpt: checkpoint.Checkpoint | None) -> None:
        """A multi-agent run: a MultiRLModule (a module per module id), its trainer, and an intake that decodes
        each agent's chunks in that agent's spaces and counts steps by count_steps_by."""
        settings, spec = self.settings, self.spec
        assert spec.multi_agent is not None
        agents = agent_spaces_of(self.observation_space, self.action_space)
        self.connectors = build_multi_agent_env_to_module(spec, agents, self.imports)
        if ckpt is not None and ckpt.connector_state:
            self.connectors.set_state(ckpt.connector_state)
        modules = pipeline_module_spaces(self.connectors)
        assert self.connectors.observation_space is not None  # {module id: space}
        module = build_multi_rl_module(spec, modules, self.imports)
        for module_id, weights in ((ckpt.module_weights or {}) if ckpt else {}).items():
            assert ckpt is not None  # its weights
            with ckpt.loading_weights():
                load_weights(module[module_id], weights)
        module.to(self.device).eval()
        common: dict[str, Any] = {
            "trainable": modules_to_train(spec, list(modules)),
            "count_steps_by": spec.multi_agent.count_steps_by,
            "seed": spec.seed,
            "version": ckpt.version if ckpt else 0,
            "module_versions": ckpt.module_versions if ckpt else None,
            "env_steps": ckpt.env_steps if ckpt else 0,
        }
        pipeline = build_multi_agent_learner_connector(spec, modules, self.imports, device=str(self.device))
        if isinstance(spec.algorithm, DQNConfig | SACConfig):  # OFF_POLICY
            state = ckpt.learner_state if ckpt else None
            self.trainer = OffPolicyTrainer(
                module, pipeline, spec.algorithm, state=state, buffer_state=self._replay_buffer(ckpt), **common
            )
        else:
            self.trainer = MultiAgentTrainer(
                module,
                pipeline,
                spec.algorithm,
                max_staleness=settings.max_staleness,
                optimizer_states=ckpt.module_optimizer_states if ckpt else None,
                **common,
            )
        self.intake = Intake(
            settings.checkpoint_dir / "intake",
            BatchDecoder(
                [self.connectors.observation_space],
                self.action_space,
                module_spaces=episode_module_spaces(spec, agents, self.connectors, self.imports),
                agents=frozenset(agents),
                output_shapes={m: learner_output_shapes(module[m], spec.algorithm.name) for m in modules},
                allow_nonfinite_obs=spec.env.allow_nonfinite_obs,
            ),
            trained=set(ckpt.trained_chunks if ckpt else ()),
            stale=set(ckpt.stale_chunks if ckpt else ()),
            resume=settings.resume,
            on_reject=lambda reason, chunks: self.metrics.rejected.labels(reason).inc(chunks),
            split_chunks=False,
            count=self.trainer.steps,
        )
        self._init_service()

    def _init_service(self) -> None:
        """What both kinds of run share once the trainer and intake exist: published weights, counters."""
        self.watchers = 0  # servers watching for weights now
        self.weights = self._weights_message()
        self.last_update: dict[str, Any] = {}
        self.started = time.time()
        # Update and episode histories (the live page's), and the experiment log (TensorBoard, progress.csv).
        self.progress = Progress(self.settings.experiment_log_dir(), env_steps=self.trainer.env_steps)
        self.progress.episodes_finished(self.intake.take_finished(), self.env_steps_received())
        self.servers = Servers()  # the inference servers that report to this learner
        self.updating_since: float | None = None  # when the update in progress started (time.time())
        self._waiting_for_batch = False  # train_once waits for the intake to hold a train batch
        self._steps_in_while_updating = 0  # steps (as train_batch_size counts) taken in while the update trains
        self._published = asyncio.Condition()
        # Updates, weight snapshots and checkpoints run here one at a time, off the event loop.
        self._trainer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgate-trainer")
        # Intake changes: a batch came in (an update may start), or an update took its steps (room for more).
        self._intake_changed = asyncio.Condition()
        self.chunks_accepted = 0  # episode chunks taken into the intake by this process
        self.max_pending_steps = self.intake.pending_steps  # the most the intake held (it stays near one batch)
        self.stale_steps = 0  # env steps dropped for exceeding max_staleness, by this process
        self.skipped_updates = 0  # updates undone for non-finite results, by this process
        self.failed_updates_in_a_row = 0  # updates that raised since the last one that did not (`rlgate up` stops)
        self.checkpointed_at: float | None = None  # when this process last wrote a checkpoint (time.monotonic())
        self.best = BestCheckpoint(self.settings.checkpoint_dir, resume=self.settings.resume)
        self.metrics.model_version.set(self.trainer.version)

    # --- data in, weights out ---------------------------------------------------------------------

    def decode(self, batch: learner_pb2.EpisodeBatch, payload: bytes | None = None) -> DecodedBatch:
        """A server's batch as `accept` takes it (`payload`: its bytes as received, if known): decoded in this
        run's spaces, its chunks checked (`batch_decoder`)."""
        return self.intake.decoder.decode(batch, payload)

    async def accept(self, batch: DecodedBatch) -> learner_pb2.EpisodeAck:
        """Take a server's decoded batch into the intake (durably), merge its connector statistics; the ack.

        Pacing: a batch is taken (and acknowledged) only while the intake holds less than one train batch,
        and the ack says how many steps the next update still needs (`room`). While an update runs, the
        servers' next train batch comes in; a server holding more than `room` (unacknowledged, or in running
        episodes) ships its running episodes and pauses until the next update takes its batch and the held
        ack comes. So sampling overlaps training by one version, and no topology piles up data the learner
        cannot use. (The window of unacknowledged steps the weights tell servers, `max_unacked_steps`,
        bounds them while no ack comes at all.) Without `algorithm.overlap_sampling` nothing is taken while
        an update runs: the ack that filled the batch said room 0, so the servers wait, and each batch is
        sampled by the version it trains.
        """
        async with self._intake_changed:
            await self._intake_changed.wait_for(lambda: self._room() > 0)
            pending = self.intake.pending_steps
            ack = self.intake.accept(batch)
            if self.updating_since is not None:
                self._steps_in_while_updating += self.intake.pending_steps - pending
            ack.room, ack.version = self._room(), self.weights.version
            self._intake_changed.notify_all()
        if batch.connector_state_error:
            self.intake.reject("malformed connector state", 1, batch.connector_state_error)
        elif batch.connector_state is not None:
            self._merge_connector_state(batch.connector_state, batch.server_id)
        self.chunks_accepted += ack.accepted
        self.progress.episodes_finished(self.intake.take_finished(), self.env_steps_received())
        self.metrics.duplicates.inc(ack.duplicates)
        self.metrics.episodes.inc(ack.accepted)
        self.metrics.pending_steps.set(self.intake.pending_steps)
        self.max_pending_steps = max(self.max_pending_steps, self.intake.pending_steps)
        return ack

    def _room(self) -> int:
        """Env steps the learner takes in before it holds the next update's: PPO's, the steps the next update still
        needs (none while an update runs without `overlap_sampling`); DQN's and SAC's, those that bring it to two
        calls' worth of updates ahead of the updates done (`off_policy_window`)."""
        algorithm = self.spec.algorithm
        if isinstance(self.trainer, OffPolicyTrainer):  # OFF_POLICY
            ahead = self.trainer.steps_trained_for() + 2 * self.off_policy_window()
            return max(0, int(ahead) - self.env_steps_received())
        assert isinstance(algorithm, PPOConfig)
        # Without overlap_sampling, no room from the update's start until its version is published: the acks that
        # then make room say that version, and servers sample the next batch with it.
        if not algorithm.overlap_sampling and (
            self.updating_since is not None or self.trainer.version != self.weights.version
        ):
            return 0
        size, pending = algorithm.train_batch_size, self.intake.pending_steps
        if algorithm.overlap_sampling and self._waiting_for_batch and pending >= size:
            # The update waiting for this batch takes it at once: the room is the next batch's. Said now, in the ack
            # that filled the batch, a server samples on; said by the ack of a later batch, it would first pause,
            # ship its running episodes and wait for their ack (a local client at 1x1 spent 18-24% of its time so).
            pending -= size
        return max(0, size - pending)

    def off_policy_window(self) -> float:
        """DQN's and SAC's env steps per call of the trainer: those `broadcast_interval` updates earn, or one chunk
        from every sub-env of a client, if more (taking less would leave updates waiting on a client's chunks)."""
        algorithm, sampling = self.spec.algorithm, self.spec.sampling
        assert isinstance(algorithm, DQNConfig | SACConfig)  # asked in off-policy runs only
        return max(
            algorithm.broadcast_interval * algorithm.steps_per_update(),
            sampling.rollout_fragment_length * self.spec.env.num_envs,
        )

    def weights_after(self, version: int, server_id: str) -> AsyncIterator[learner_pb2.Weights]:
        """Every version newer than `version`, as it is published (the newest first, if newer already).

        `version` is -1 (none yet) or below MAX_VERSION; anything else raises ValueError here, at the call,
        before the learner skips its own version past it.
        """
        if not -1 <= version < MAX_VERSION:
            raise ValueError(f"after_version {version} is out of range: -1 (none yet) or a version below 2**62")
        return self._weights_after(version, server_id)

    async def _weights_after(self, version: int, server_id: str) -> AsyncIterator[learner_pb2.Weights]:
        if version >= self.weights.version:
            # The server may hold a version this learner published before a restart and lost (or has since
            # reused for other weights): publish ours under a newer number, which every server takes.
            await self.in_trainer_thread(self._skip_version, version + 1)
            await self._publish()
            log.info("server %s has version %d: published version %d", server_id, version, self.weights.version)
        self.watchers += 1
        try:
            while True:
                async with self._published:

                    def newer(v: int = version) -> bool:
                        return self.weights.version > v

                    await self._published.wait_for(newer)
                    weights = self.weights
                version = weights.version
                yield weights
        finally:
            self.watchers -= 1

    def status_message(self) -> learner_pb2.LearnerStatus:
        mean = self.mean_return()
        return learner_pb2.LearnerStatus(
            model_version=self.trainer.version,
            env_steps_trained=self.trainer.env_steps,
            episodes_received=self.chunks_accepted,
            duplicates=self.intake.duplicates,
            stale_dropped=self.stale_steps,
            mean_return=mean if mean is not None else float("nan"),
        )

    # --- training -----------------------------------------------------------------------------------

    async def train_forever(self) -> None:
        """Update whenever a train batch is pending; publish; checkpoint when due."""
        while True:
            await self.train_once()

    async def train_once(self) -> None:
        """Wait for a train batch (PPO: `train_batch_size` steps, dropping chunks too stale to train on; DQN, SAC:
        any steps, or updates owed), take it, update."""
        if isinstance(self.trainer, OffPolicyTrainer):  # OFF_POLICY
            trainer = self.trainer
            async with self._intake_changed:
                await self._intake_changed.wait_for(lambda: self.intake.pending_steps > 0 or trainer.owed_updates() > 0)
                episodes = self.intake.take(self.intake.pending_steps)
                self._intake_changed.notify_all()
            await self._update(episodes)
            return
        size = self.spec.algorithm.train_batch_size
        async with self._intake_changed:
            while True:
                stale = self.intake.drop_stale(self.trainer.oldest_version())
                if stale:
                    self.stale_steps += stale
                    self.metrics.stale.inc(stale)
                    log.info("dropped %d env steps older than max_staleness=%d", stale, self.settings.max_staleness)
                    self._intake_changed.notify_all()  # that made room: batches waiting for it may come in
                if self.intake.pending_steps >= size:
                    break
                self._waiting_for_batch = True
                try:
                    await self._intake_changed.wait()
                finally:
                    self._waiting_for_batch = False
            episodes = self.intake.take(size)
            self._intake_changed.notify_all()  # room for the next batch, sampled while this one trains
        await self._update(episodes)

    async def _update(self, episodes: list[Any]) -> None:
        """One call of the trainer on these chunks (on its thread); publish and checkpoint a new version."""
        self.metrics.pending_steps.set(self.intake.pending_steps)
        started = time.perf_counter()
        self.updating_since, self._steps_in_while_updating = time.time(), 0
        try:
            stats = await self.in_trainer_thread(self.trainer.update, episodes)
        except GroupFailed as exc:  # a data-parallel learner died: the weights are a half-done update's
            fail(exc)
        except Exception:  # e.g. a user's learner piece failing: say so, keep the service (and the rest) alive
            self.metrics.failed_updates.inc()
            self.failed_updates_in_a_row += 1
            log.exception("update failed: the %d env steps it took are not trained on", sum(map(len, episodes)))
            return
        finally:
            self.updating_since = None
            async with self._intake_changed:  # room again, where overlap_sampling withheld it
                self._intake_changed.notify_all()
        self.failed_updates_in_a_row = 0
        if stats.get("updates") == 0:  # off-policy: steps into the replay buffer, no update earned yet
            self.metrics.env_steps.inc(stats["env_steps"])
            return
        seconds = time.perf_counter() - started
        # With overlap_sampling, the next batch's sampling overlapping this update; 0 without (nothing is taken).
        stats["steps_in_during_update"] = self._steps_in_while_updating
        self.last_update = {**stats, "seconds": seconds, "version": self.trainer.version}
        if "skipped" in stats:
            self.skipped_updates += 1
            self.metrics.skipped_updates.inc()
            log.error(
                "update skipped, weights stay at version %d: %s (from %d env steps)",
                self.trainer.version,
                stats["skipped"],
                stats["env_steps"],
            )
            return
        self._record(stats, seconds)
        await self._publish()
        if self._checkpoint_due():
            await self.save_checkpoint()
        by_module = " ".join(f"{m}={r:.3g}" for m, r in self.module_mean_returns().items())
        loss = f"qf_loss={stats['qf_loss']:.4g}" if "qf_loss" in stats else f"kl={stats.get('kl', 0.0):.4f}"
        log.info(
            "update version=%d env_steps=%d mean_return=%s %s%s",
            self.trainer.version,
            stats["env_steps"],
            self.mean_return(),
            loss,
            f" module_mean_returns: {by_module}" if by_module else "",
        )

    async def save_checkpoint(self) -> Path:
        """Write a checkpoint (on the trainer thread, so never during an update), then drop intake files."""
        covered, version, mean = self.intake.checkpoint_state(), self.trainer.version, self.mean_return()
        self.checkpointed_at = time.monotonic()
        path = await self.in_trainer_thread(self._write_checkpoint, covered, mean)
        self.intake.checkpointed(covered)
        log.info("checkpoint %s", path)
        self.best.offer(path, version, mean if len(self.intake.returns) >= RETURN_WINDOW else None)
        return path

    def _checkpoint_due(self) -> bool:
        """After this process's first update, then every `checkpoint_every` versions or `checkpoint_every_s`
        seconds, whichever comes first: a learner that dies early, or trains slowly, loses little."""
        settings = self.settings
        return (
            self.checkpointed_at is None
            or self.trainer.version % settings.checkpoint_every == 0
            or time.monotonic() - self.checkpointed_at >= settings.checkpoint_every_s
        )

    def _write_checkpoint(self, covered: Covered, mean_return: float | None) -> Path:
        multi_agent = bool(self.spec.multi_agent)
        return checkpoint.save(
            self.settings.checkpoint_dir,
            version=self.trainer.version,
            spec=self.spec,
            observation_space=self.observation_space,
            action_space=self.action_space,
            weights=self._module_weights() if multi_agent else weights_to_bytes(self.trainer.module),
            optimizer=self.trainer.optimizer,
            connector_state=self.connectors.get_state(),
            trained_chunks=covered.trained,
            stale_chunks=covered.stale,
            partial_chunks=covered.partial,
            env_steps=self.trainer.env_steps,
            module_versions=self.trainer.module_versions
            if multi_agent and not isinstance(self.trainer, Trainer)
            else None,
            mean_return=mean_return,
            **self._off_policy_state(),
        )

    def _off_policy_state(self) -> dict[str, checkpoint.State]:
        """DQN's and SAC's parts of a checkpoint: the trainer's state, and the replay buffer's if the spec keeps it."""
        if not isinstance(self.trainer, OffPolicyTrainer):  # OFF_POLICY
            return {}
        parts = {"learner_state": self.trainer.state()}
        assert isinstance(self.spec.algorithm, DQNConfig | SACConfig)
        if self.spec.algorithm.store_buffer_in_checkpoints:
            parts["replay_buffer"] = self.trainer.buffer_state()
        return parts

    def _module_weights(self) -> dict[str, bytes]:
        return {module_id: weights_to_bytes(module) for module_id, module in self.trainer.module.items()}

    def _merge_connector_state(self, delta: Any, server_id: str) -> None:
        """Add a server's statistics delta to the merged ones, which go out with the next weights.

        A state that does not fit this learner's pipeline (its pieces' `check_state`), or whose merge does not,
        comes from a server configured otherwise or broken: it is refused (logged, counted as "malformed
        connector state"), so it never reaches the servers, and the batch's chunks are taken all the same.
        """
        try:
            self.connectors.check_state(delta)
            merged = self.connectors.merge_states([delta])
            self.connectors.check_state(merged)  # e.g. finite statistics whose merge overflowed
        except Exception as exc:  # a user's piece may raise anything: the batch is stored, its ack must come
            self.intake.reject("malformed connector state", 1, f"connector state from server {server_id}: {exc}")
            return
        self.connectors.set_state(merged)

    def _skip_version(self, version: int) -> None:
        self.trainer.version = max(self.trainer.version, version)

    async def in_trainer_thread(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the trainer thread, after the update, snapshot or checkpoint in progress there."""
        return await asyncio.get_running_loop().run_in_executor(self._trainer_thread, fn, *args)

    async def _publish(self) -> None:
        weights = await self.in_trainer_thread(self._weights_message)
        async with self._published:
            self.weights = weights
            self._published.notify_all()
        async with self._intake_changed:  # where room waited for this version (no overlap_sampling)
            self._intake_changed.notify_all()
        self.metrics.model_version.set(weights.version)

    def _weights_message(self) -> learner_pb2.Weights:
        per_module: dict[str, Any]
        if self.spec.multi_agent and not isinstance(self.trainer, Trainer):  # a multi-agent trainer
            per_module = {"module_weights": self._module_weights(), "module_versions": self.trainer.module_versions}
        else:
            per_module = {"safetensors": weights_to_bytes(self.trainer.module)}
        return learner_pb2.Weights(
            version=self.trainer.version,
            **per_module,
            observation_space=codec.space_to_proto(self.observation_space),
            action_space=codec.space_to_proto(self.action_space),
            spec_json=self.spec.to_json(),
            max_unacked_steps=self.spec.algorithm.max_unacked_steps(servers=self.watchers),
            connector_state=codec.to_value(self.connectors.get_state()),
        )

    def _record(self, stats: dict[str, Any], seconds: float) -> None:
        m = self.metrics
        m.env_steps.inc(stats["env_steps"])
        m.stale.inc(stats["stale_steps"])
        self.stale_steps += stats["stale_steps"]
        m.staleness.set(stats["staleness"])
        for gauge, key in (
            (m.policy_loss, "policy_loss"),
            (m.vf_loss, "vf_loss"),
            (m.entropy, "entropy"),
            (m.kl, "kl"),
            (m.qf_loss, "qf_loss"),
            (m.td_error, "td_error_mean"),
            (m.alpha, "alpha"),
            (m.epsilon, "epsilon"),
            (m.buffer_size, "buffer_size"),
            (m.replay_ratio, "replay_ratio"),
        ):
            if key in stats:
                gauge.set(stats[key])
        mean = self.mean_return()
        if mean is not None:
            m.mean_return.set(mean)
        for module_id, module_mean in self.module_mean_returns().items():
            m.module_mean_return.labels(module_id).set(module_mean)
        elapsed = time.time() - self.started
        m.episodes_per_s.set(self.intake.episodes_finished / max(elapsed, 1e-9))
        self.progress.update(
            stats,
            env_steps=self.trainer.env_steps,
            version=self.trainer.version,
            seconds=seconds,
            episodes=self.intake.episodes_finished,
            returns=self.intake.returns,
            lengths=self.intake.lengths,
        )

    def mean_return(self) -> float | None:
        returns = self.intake.returns
        return sum(returns) / len(returns) if returns else None

    def module_mean_returns(self) -> dict[str, float]:
        """Multi-agent: each module's mean return (its agents' rewards summed per episode) over the last 20
        episodes it played in, as RLlib's module_episode_returns_mean (empty for single-agent runs)."""
        return _means(self.intake.module_returns)

    def agent_mean_returns(self) -> dict[str, float]:
        """Multi-agent: each agent's mean return over the last 20 episodes it played in, as RLlib's
        agent_episode_returns_mean (empty for single-agent runs)."""
        return _means(self.intake.agent_returns)

    def env_steps_received(self) -> int:
        """Env steps trained on plus those waiting for the next update: the episodes' x axis."""
        return self.trainer.env_steps + self.intake.pending_steps

    def status(self) -> dict[str, Any]:
        """Where training stands now (compact: the histories are paged at /history/updates and /episodes)."""
        updating = self.updating_since
        return {
            "env_id": self.spec.env.id,
            "model_version": self.trainer.version,
            "env_steps_trained": self.trainer.env_steps,
            "env_steps_received": self.env_steps_received(),
            "episodes": self.intake.episodes_finished,
            "mean_return": self.mean_return(),
            "module_mean_returns": self.module_mean_returns(),
            "agent_mean_returns": self.agent_mean_returns(),
            "train_batch_size": self.spec.algorithm.train_batch_size,
            "pending_steps": self.intake.pending_steps,
            "max_pending_steps": self.max_pending_steps,
            "duplicates": self.intake.duplicates,
            "rejected_chunks": dict(self.intake.rejected),
            "skipped_updates": self.skipped_updates,
            "failed_updates_in_a_row": self.failed_updates_in_a_row,
            "stale_steps": self.stale_steps,
            "update_in_progress": updating is not None,
            "update_running_s": None if updating is None else time.time() - updating,
            "last_update": self.last_update,
            "servers": self.servers.connected(),
            "history": {"updates": self.progress.updates.total, "episodes": self.progress.episodes.total},
            "best_checkpoint": self.best.status(),
            "uptime_s": time.time() - self.started,
        }


def resumable(ckpt: checkpoint.Checkpoint, given: RunSpec, imports: ImportPolicy, where: Path) -> RunSpec:
    """The given spec, if the checkpoint's run can go on under it: same env, spaces, model and env-to-module
    pieces (sampling, learner pieces and the algorithm's hyper-parameters may change). Else SpecError."""
    spaces = run_spaces(given.env, bool(given.multi_agent), imports)
    mine = f"{ckpt.spec.env.id} {ckpt.spec.env.kwargs or ''}".strip()
    theirs = f"{given.env.id} {given.env.kwargs or ''}".strip()
    if (mine, ckpt.observation_space, ckpt.action_space) != (theirs, *spaces):
        raise SpecError(
            f"{where} holds a run of {mine} (observations {ckpt.observation_space}, actions "
            f"{ckpt.action_space}); the run spec given is {theirs} (observations {spaces[0]}, actions "
            f"{spaces[1]}): pass another --checkpoint-dir, or --no-resume to start afresh"
        )
    if ckpt.spec.algorithm.name != given.algorithm.name:
        raise SpecError(
            f"{where} holds a {ckpt.spec.algorithm.name} run; the run spec given is {given.algorithm.name}'s "
            "(algorithm.name): pass another --checkpoint-dir, or --no-resume to start afresh"
        )
    for part in ("model", "connectors.env_to_module"):
        old, new = (_part(s, part) for s in (ckpt.spec, given))
        if old != new:
            raise SpecError(
                f"{where} holds a model built with {part} = {old}; the run spec given has {new}: the weights "
                "would not fit. Pass another --checkpoint-dir, or --no-resume to start afresh"
            )
    if given != ckpt.spec:
        log.info("resuming %s under a changed run spec (sampling, learner pieces or algorithm)", where)
    return given


def _part(spec: RunSpec, dotted: str) -> Any:
    value: Any = spec
    for name in dotted.split("."):
        value = getattr(value, name)
    return value.model_dump() if hasattr(value, "model_dump") else [v.model_dump() for v in value]


def _means(windows: dict[str, deque[float]]) -> dict[str, float]:
    """Each window's mean, by key in order."""
    return {key: sum(window) / len(window) for key, window in sorted(windows.items())}
