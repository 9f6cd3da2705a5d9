"""The off-policy training step (DQN, SAC): chunks into the replay buffer, updates at the replay ratio, version + 1.

Each call of `update(chunks)` adds the chunks to the replay buffer (their env steps are then sampled) and runs the
updates they earned: once `num_steps_sampled_before_learning_starts` env steps are in, every
`train_batch_size / training_intensity` env steps earn one update of `train_batch_size` replayed transitions, at
most `broadcast_interval` per call. A call that updated publishes one new version (servers act with it), whose
stats are the mean over its updates. Targets move after an update once `target_network_update_freq` env steps
were sampled since they last did (every update for 0), as RLlib's DQNLearner counts. A call whose updates leave
a non-finite value anywhere is undone (modules, target networks, temperatures and optimizers) and skipped, as
PPO's.

Multi-agent, as RLlib's multi-agent DQN: each trained module has its own replay buffer (its agents' chunks),
networks and optimizers; steps are counted as `count_steps_by` says, and each update trains every trained module
on a batch of its own transitions. Chunks of modules not trained count and are not kept.

The replay buffers keep what the losses read (observations, actions, rewards, done flags) and the model version
that chose each action, for the `staleness` diagnostic: servers may act with older weights, which off-policy
learning takes as it is. When the learner pipeline holds only its default pieces, batches come from a buffer's
columns at once (`sample_transitions`); with a piece of the user's, the sampled one-step episodes go through the
pipeline, as RLlib's do (single-agent runs: a multi-agent run takes no learner pieces of the user's yet).

Data-parallel learners (`join`): rank 0 holds the replay buffers and samples each update's train batch (multi-agent:
each trained module's, one after the other), which it scatters; every rank runs the update on its shard (`follow` on
the others), each optimizer step on the whole batch's gradients, and moves its targets and undoes a version's
updates as rank 0 says. Rank 0 gathers the TD errors back for a prioritized buffer's priorities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlgate.connectors import ConnectorPipelineV2
from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.adam import Adam
from rlgate.learner.data_parallel import Group
from rlgate.learner.device import module_device
from rlgate.learner.dqn import DQNLearner
from rlgate.learner.episode_replay_buffer import EpisodeReplayBuffer
from rlgate.learner.prioritized_episode_replay_buffer import PrioritizedEpisodeReplayBuffer
from rlgate.learner.sac import SACLearner
from rlgate.learner.trainer import Snapshot, scheduled_values, skipped_reason
from rlgate.models import MultiRLModule, RLModule
from rlgate.spec.algorithm import DQNConfig, ReplayBufferConfig, SACConfig
from rlgate.spec.imports import SpecError
from rlgate.storage.checkpoint import State, optimizer_from_tensors, optimizer_to_tensors

OffPolicyConfig = DQNConfig | SACConfig

#: The default pieces of DQN's and SAC's learner pipeline, in order (single-, multi-agent): with these alone, the
#: replay buffers' columns are the batches.
DEFAULT_PIECES = tuple(type(p) for p in build_learner_pipeline(None, None, next_observations=True).connectors)
MULTI_AGENT_PIECES = tuple(
    type(p) for p in build_learner_pipeline(None, None, next_observations=True, module_spaces={}).connectors
)


def make_buffer(config: ReplayBufferConfig, seed: int | None) -> EpisodeReplayBuffer:
    """The replay buffer a spec's `replay_buffer_config` names."""
    if config.type == "PrioritizedEpisodeReplayBuffer":
        return PrioritizedEpisodeReplayBuffer(config.capacity, alpha=config.alpha, seed=seed)
    return EpisodeReplayBuffer(config.capacity, seed=seed)


def make_learner(module: RLModule, config: OffPolicyConfig) -> DQNLearner | SACLearner:
    return DQNLearner(module, config) if isinstance(config, DQNConfig) else SACLearner(module, config)


@dataclass
class Part:
    """One trained module: its learner (networks, optimizers, update step), replay buffer and the pipeline that
    makes its batches."""

    module: RLModule
    learner: DQNLearner | SACLearner
    buffer: EpisodeReplayBuffer
    pipeline: ConnectorPipelineV2


class OffPolicyTrainer:
    """Owns the module(s) being trained, their learner-side networks, optimizers and replay buffers, and the counts."""

    def __init__(
        self,
        module: RLModule | MultiRLModule,
        pipeline: ConnectorPipelineV2,
        config: OffPolicyConfig,
        *,
        seed: int | None = None,
        version: int = 0,
        env_steps: int = 0,
        state: State | None = None,
        buffer_state: State | None = None,
        trainable: list[str] | None = None,
        count_steps_by: str = "env_steps",
        module_versions: dict[str, int] | None = None,
    ) -> None:
        """`pipeline`: the spec's learner pipeline. Multi-agent (a MultiRLModule): `trainable` module ids, steps
        counted by `count_steps_by`, each module's version. `state`: a checkpoint's `learner_state` (optimizers,
        target networks, alpha, counters) to go on from; `buffer_state`: its replay buffers', if it kept them."""
        self.module = module
        self.config = config
        self.version = version
        self.env_steps = env_steps  # sampled into the replay buffers since version 0 (kept in checkpoints)
        self.updates = 0  # updates since version 0 (kept in checkpoints)
        self.replayed = 0  # transitions replayed since version 0 (kept in checkpoints)
        self.last_target_update = 0  # env_steps when the targets last moved
        self.count_steps_by = count_steps_by
        self.multi_agent = isinstance(module, MultiRLModule)
        pieces = tuple(type(piece) for piece in pipeline.connectors)
        self.module_versions: dict[str, int] | None
        self.parts: dict[str | None, Part]  # by module id (single-agent: None)
        if self.multi_agent:
            if pieces != MULTI_AGENT_PIECES:
                raise SpecError(f"connectors.learner: multi-agent {config.name} takes no learner pieces of its own yet")
            self.module_versions = {m: (module_versions or {}).get(m, 0) for m in module}
            modules = {m: module[m] for m in trainable or list(module)}
            self.parts = {m: self._part(sub, config, seed, None) for m, sub in modules.items()}
        else:
            self.module_versions = None
            self._fast = pieces == DEFAULT_PIECES
            self.parts = {None: self._part(module, config, seed, pipeline)}
        if state is not None:
            self.load_state(state)
        if buffer_state is not None:
            self._set_buffer_state(buffer_state)
        for part in self.parts.values():
            part.learner.explore(config.at(env_steps))
        self.group: Group | None = None  # the data-parallel learners this one trains with (`join`)
        self._before: Snapshot | None = None  # a follower's state before the version rank 0 is training
        self._following = 0  # a follower's updates of that version so far

    @staticmethod
    def _part(module: RLModule, config: OffPolicyConfig, seed: int | None, pipeline: Any) -> Part:
        """A trained module's part; multi-agent (no pipeline given), its batches go through default pieces alone."""
        if pipeline is None:
            pipeline = build_learner_pipeline(
                module.observation_space, module.action_space, next_observations=True, device=module_device(module)
            )
        return Part(module, make_learner(module, config), make_buffer(config.replay_buffer_config, seed), pipeline)

    def join(self, group: Group) -> None:
        """Train with the group's other ranks from now on, all from rank 0's networks (every trained module, its
        targets, SAC's temperature) and optimizer states."""
        group.share_state(self._everything(), *self._optimizers())
        self.group = group
        for part in self.parts.values():
            part.learner.group = group

    def follow(self, header: dict[str, Any], shard: dict[str, Any]) -> int:
        """A follower rank's part of one module's update that rank 0 runs (`_update_part`): the update on its shard,
        with the hyper-parameters at rank 0's env steps. After the update's last module, every module's targets
        moved if rank 0 moves them; after a version's last update, the version undone if rank 0's is (the ranks'
        weights are the same, so are their non-finite values), or checked against rank 0's. The updates it
        trained: after a version's last, the version's (0 if undone)."""
        assert self.group is not None  # joined
        part = self.parts[header["module"]]
        if self._before is None:  # the version's first update
            self._before = Snapshot(self._everything(), *self._optimizers())
            self._following = 0
        config = self.config.at(header["env_steps"])
        _, td_error = part.learner.update(shard, config)
        if isinstance(part.buffer, PrioritizedEpisodeReplayBuffer):
            self.group.gather(td_error)
        if not header["done"]:  # more modules to update first
            return 0
        self._following += 1
        if header["target"]:
            for each in self.parts.values():
                each.learner.update_target(self.config.tau)
        if not header["last"]:
            return 0
        before, self._before = self._before, None
        if before.nonfinite_now():
            before.restore()
            return 0
        for each in self.parts.values():
            each.learner.explore(config)
        self.group.check_identical(self._everything())
        return self._following

    @property
    def learner(self) -> DQNLearner | SACLearner:
        """A single-agent run's learner."""
        return self.parts[None].learner

    @property
    def buffer(self) -> EpisodeReplayBuffer:
        """A single-agent run's replay buffer."""
        return self.parts[None].buffer

    @property
    def spaces(self) -> tuple[Any, Any]:
        return self.module.observation_space, self.module.action_space

    @property
    def optimizer(self) -> None:
        """Off-policy optimizers are in `state()`: there is no single one."""
        return None

    def oldest_version(self) -> int | dict[str, int]:
        """No steps are too old to replay."""
        oldest = -(2**62)
        return {m: oldest for m in self.module_versions} if self.module_versions is not None else oldest  # multi-agent

    def steps(self, episodes: list[SingleAgentEpisode]) -> int:
        """The steps these chunks hold, counted by count_steps_by (multi-agent; single-agent: their length)."""
        if self.multi_agent and self.count_steps_by == "env_steps":
            return sum(e.multi_agent_env_steps for e in episodes)
        return sum(len(e) for e in episodes)

    def owed_updates(self) -> int:
        """Updates the env steps sampled so far have earned and not had."""
        config = self.config
        start = config.num_steps_sampled_before_learning_starts
        if self.env_steps < start or not any(len(part.buffer) for part in self.parts.values()):
            return 0
        return max(0, int((self.env_steps - start) / config.steps_per_update()) - self.updates)

    def steps_trained_for(self) -> float:
        """The env steps whose updates are done: where the next update's steps begin."""
        return self.config.num_steps_sampled_before_learning_starts + self.updates * self.config.steps_per_update()

    def update(self, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
        """Add these chunks to the replay buffers, then run the updates owed (at most `broadcast_interval`).

        The stats have "updates" (0: no new version) and, when the updates were undone for non-finite results,
        "skipped" (why)."""
        added = self.add(episodes)
        count = min(self.owed_updates(), self.config.broadcast_interval)
        counts = {"env_steps": added, "stale_steps": 0, "updates": count}
        if not count:
            return counts
        before = Snapshot(self._everything(), *self._optimizers())
        replayed = self.replayed
        parts: dict[str | None, dict[str, list[float]]] = {m: {} for m in self.parts}
        filled = [(module_id, part) for module_id, part in self.parts.items() if len(part.buffer)]
        for index in range(count):
            config = self.config.at(self.env_steps)
            move_targets = self.env_steps - self.last_target_update >= self.config.target_network_update_freq
            for position, (module_id, part) in enumerate(filled):
                done = position == len(filled) - 1  # the update's last module: the followers then do as rank 0
                after = {"module": module_id, "done": done, "target": move_targets, "last": index == count - 1}
                self._update_part(part, config, parts[module_id], after)
            self.updates += 1
            if move_targets:
                for part in self.parts.values():
                    part.learner.update_target(self.config.tau)
                self.last_target_update = self.env_steps
        bad = before.nonfinite_now()
        if bad:
            before.restore()
            self.updates -= count
            self.replayed = replayed
            return {**counts, "skipped": skipped_reason(bad)}
        self.version += 1
        config = self.config.at(self.env_steps)
        means = {m: {key: float(np.mean(v)) for key, v in stats.items()} for m, stats in parts.items() if stats}
        for module_id, part in self.parts.items():
            means.setdefault(module_id, {}).update(part.learner.explore(config))
            if self.module_versions is not None and module_id in means:  # multi-agent: module ids
                assert module_id is not None
                self.module_versions[module_id] += 1
        keys = {key for stats in means.values() for key in stats}
        overall = {key: float(np.mean([s[key] for s in means.values() if key in s])) for key in sorted(keys)}
        if self.group is not None:
            self.group.check_identical(self._everything())
            overall["check_s"] = self.group.seconds["check_s"]
        return {
            "staleness": 0.0,  # unless the chunks recorded their model versions (servers' always do)
            **overall,
            **({"modules": means} if self.multi_agent else {}),
            **scheduled_values(config),
            **counts,
            "buffer_size": sum(len(part.buffer) for part in self.parts.values()),
            "replay_ratio": self.replayed / max(self.env_steps, 1),
            "updates_total": self.updates,
        }

    def _update_part(self, part: Part, config: OffPolicyConfig, stats: dict, after: dict[str, Any]) -> None:
        """One update of one module on a batch of its transitions; its stats appended to `stats`. `after`: the
        module's id and what the group's followers do after it (`follow`)."""
        batch, versions = self._batch(part)
        if self.group is not None:  # every rank updates on its shard of the batch
            batch = self.group.send_batch(batch, self.env_steps, **after)
        values, td_error = part.learner.update(batch, config)  # type: ignore[arg-type]  # learner and config: one algorithm's
        if isinstance(part.buffer, PrioritizedEpisodeReplayBuffer):
            everyone = td_error if self.group is None else self.group.gather(td_error)
            assert everyone is not None  # rank 0's gather: the whole batch's
            part.buffer.update_priorities(everyone.cpu().numpy())
        if self.group is not None:
            values |= self.group.seconds  # the update's seconds in collectives: scatter_s, allreduce_s, gather_s
        self.replayed += self.config.train_batch_size
        if versions is not None:
            version = self.version
            if self.module_versions is not None:  # multi-agent
                version = self.module_versions[after["module"]]
            values["staleness"] = float(version - versions.mean())
        for key, value in values.items():
            stats.setdefault(key, []).append(value)

    def add(self, episodes: list[SingleAgentEpisode]) -> int:
        """Put chunks into their module's replay buffer, keeping of their model outputs only the versions; their
        steps (as counted)."""
        for episode in episodes:
            part = self.parts.get(episode.module_id if self.multi_agent else None)
            if part is None:  # a module not trained
                continue
            for key in list(episode.extra_model_outputs):
                if key != Columns.MODEL_VERSION:
                    del episode.extra_model_outputs[key]
            part.buffer.add(episode)
        steps = self.steps(episodes)
        self.env_steps += steps
        return steps

    def _batch(self, part: Part) -> tuple[dict[str, Any], np.ndarray | None]:
        """A train batch from a part's replay buffer (tensors), and the model versions of its transitions if known."""
        config = self.config
        sampling: dict[str, Any] = {"n_step": config.n_step, "gamma": config.gamma, "include_extra_model_outputs": True}
        if config.replay_buffer_config.type == "PrioritizedEpisodeReplayBuffer":
            sampling["beta"] = config.replay_buffer_config.beta
        if self.multi_agent or self._fast:
            columns = part.buffer.sample_transitions(config.train_batch_size, **sampling)
            versions = columns.pop(Columns.MODEL_VERSION, None)
            batch = part.pipeline(rl_module=part.module, batch=columns, episodes=[], explore=False, shared_data={})
            return batch, versions
        episodes = part.buffer.sample(config.train_batch_size, **sampling)
        batch = part.pipeline(rl_module=part.module, batch={}, episodes=episodes, explore=False, shared_data={})
        versions = batch.pop(Columns.MODEL_VERSION, None)
        return batch, None if versions is None else versions.cpu().numpy()

    def state(self) -> State:
        """What a checkpoint keeps of the training beyond the modules' weights: every optimizer's state, the learner's
        own networks (targets, SAC's temperature) and the counters (multi-agent: each module's under its id)."""
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {
            "updates": self.updates,
            "replayed": self.replayed,
            "last_target_update": self.last_target_update,
            "optimizers": {},
        }
        for module_id, part in self.parts.items():
            prefix = _prefix(module_id)
            for name, optimizer in part.learner.optimizers.items():
                saved, meta["optimizers"][f"{prefix}{name}"] = optimizer_to_tensors(optimizer)
                tensors |= {f"{prefix}optimizer.{name}/{key}": value for key, value in saved.items()}
            for name, network in part.learner.networks().items():
                state = network.state_dict()
                tensors |= {f"{prefix}network.{name}/{key}": value.detach().cpu() for key, value in state.items()}
        return tensors, meta

    def load_state(self, state: State) -> None:
        """Go on from a checkpoint's `state()` (a module it does not hold starts afresh)."""
        tensors, meta = state
        self.updates, self.replayed = int(meta["updates"]), int(meta["replayed"])
        self.last_target_update = int(meta["last_target_update"])
        for module_id, part in self.parts.items():
            prefix = _prefix(module_id)
            for name, optimizer in part.learner.optimizers.items():
                if f"{prefix}{name}" in meta["optimizers"]:
                    saved = _prefixed(tensors, f"{prefix}optimizer.{name}/")
                    optimizer.load_state_dict(optimizer_from_tensors(saved, meta["optimizers"][f"{prefix}{name}"]))
            for name, network in part.learner.networks().items():
                saved = _prefixed(tensors, f"{prefix}network.{name}/")
                if saved:
                    network.load_state_dict(saved)

    def buffer_state(self) -> State:
        """The replay buffers' steps (multi-agent: each module's under its id), for a checkpoint."""
        arrays: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for module_id, part in self.parts.items():
            saved, meta[_prefix(module_id)] = part.buffer.get_state()
            arrays |= {f"{_prefix(module_id)}{key}": value for key, value in saved.items()}
        return arrays, meta

    def _set_buffer_state(self, state: State) -> None:
        arrays, meta = state
        for module_id, part in self.parts.items():
            prefix = _prefix(module_id)
            if prefix in meta:
                part.buffer.set_state(_prefixed(arrays, prefix), meta[prefix])

    def _optimizers(self) -> list[Adam]:
        """Every trained module's optimizers, in the order of `parts` (the same on every rank)."""
        return [optimizer for part in self.parts.values() for optimizer in part.learner.optimizers.values()]

    def _everything(self) -> nn.Module:
        """The modules and the learner's own networks, as one module (for snapshots)."""
        return nn.ModuleList(
            network for part in self.parts.values() for network in (part.module, *part.learner.networks().values())
        )


def _prefix(module_id: str | None) -> str:
    """Where a module's state sits in a checkpoint: under its id (multi-agent), or at the top (single-agent)."""
    return "" if module_id is None else f"{module_id}/"


def _prefixed(tensors: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {key.removeprefix(prefix): value for key, value in tensors.items() if key.startswith(prefix)}
