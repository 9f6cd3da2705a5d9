"""The multi-agent training step: agents' chunks -> learner pipeline (per-module batches, GAE per module) ->
PPO on each trainable module with its own optimizer -> version + 1.

Each module has its own version (the number of updates that changed it); servers record it with every agent
step, so staleness is counted per module: steps chosen more than `max_staleness` versions of their module ago
are masked out. Modules not in `trainable` (policies_to_train) keep their weights and version: their agents'
chunks (a frozen opponent's, whose module may change from episode to episode) count towards the train batch,
as RLlib counts them, and are then set aside before the learner pipeline (RLlib's Learner drops their batches
after it), counted as `untrained_steps`. An update that leaves a non-finite value in any module is undone for
every module and skipped, as in the single-agent trainer.

Data-parallel learners (`join`): rank 0 runs the learner pipeline and, module by module, scatters the module's
real rows (data_parallel.Group.send_batch); every rank runs PPO's epochs on its shard of that module (`follow` on
the others), each step's gradients all-reduced within the module's parameters, so each module takes the steps one
learner takes on its whole batch. After the update's last module, every rank undoes the update if any module went
non-finite, or compares its weights (every module's) with rank 0's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.adam import Adam
from rlgate.learner.data_parallel import Group
from rlgate.learner.ppo import ppo_update, real_rows
from rlgate.learner.trainer import Snapshot, scheduled_values, skipped_reason
from rlgate.models import MultiRLModule
from rlgate.spec.algorithm import PPOConfig


class MultiAgentTrainer:
    """Owns the MultiRLModule being trained, one optimizer per trainable module, and the learner pipeline."""

    def __init__(
        self,
        module: MultiRLModule,
        pipeline: ConnectorPipelineV2,
        config: PPOConfig,
        *,
        trainable: list[str],
        count_steps_by: str,
        max_staleness: int,
        seed: int | None = None,
        version: int = 0,
        module_versions: dict[str, int] | None = None,
        optimizer_states: dict[str, dict[str, Any]] | None = None,
        env_steps: int = 0,
    ) -> None:
        self.module = module
        self.pipeline = pipeline
        self.config = config
        self.trainable = trainable
        self.count_steps_by = count_steps_by
        self.max_staleness = max_staleness
        self.version = version
        self.module_versions = {m: (module_versions or {}).get(m, 0) for m in module}
        self.env_steps = env_steps  # trained on (counted by count_steps_by) by every update since version 0
        lr = config.at(env_steps).lr
        self.optimizer = {m: Adam(module[m].parameters(), lr) for m in trainable}
        for module_id, state in (optimizer_states or {}).items():
            if module_id in self.optimizer:
                self.optimizer[module_id].load_state_dict(state)
        self._rng = np.random.default_rng(seed)
        self.group: Group | None = None  # the data-parallel learners this one trains with (`join`)
        self._before: dict[str, Snapshot] = {}  # the modules trained so far in this update, as they were before

    def join(self, group: Group) -> None:
        """Train with the group's other ranks from now on, all from rank 0's weights (every module's) and its
        optimizers' states."""
        group.share_state(self.module, *self.optimizer.values())
        self.group = group

    def follow(self, header: dict[str, Any], shard: dict[str, torch.Tensor]) -> int:
        """A follower rank's part of one module's training in the update rank 0 runs: PPO's epochs on its shard of
        that module's batch, with the hyper-parameters at rank 0's env steps. After the update's last module, the
        update is undone if it left a non-finite value (as rank 0's is: the ranks' weights are the same) or checked
        against rank 0's. The updates it trained: 1 after an update's last module unless undone, else 0."""
        self._train(header["module"], shard, self.config.at(header["env_steps"]))
        if not header["last"]:
            return 0
        return int(not self._finish())

    def steps(self, episodes: list[SingleAgentEpisode]) -> int:
        """The steps these chunks hold, counted by count_steps_by."""
        if self.count_steps_by == "agent_steps":
            return sum(len(e) for e in episodes)
        return sum(e.multi_agent_env_steps for e in episodes)

    def oldest_version(self) -> dict[str, int]:
        """Per module, the oldest version of it whose steps still train (older ones are dropped before an update)."""
        return {module_id: version - self.max_staleness for module_id, version in self.module_versions.items()}

    def update(self, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
        """One PPO update of each trainable module on its agents' steps in these chunks."""
        # GAE corrects steps sampled more than one version of their module back (V-trace).
        shared = {"learner_versions": dict(self.module_versions)}
        trained = self.steps(episodes)  # before the pipeline, which adds a step to every chunk (PPO's bootstrap)
        untrained = sum(len(e) for e in episodes if e.module_id not in self.trainable)
        episodes = [e for e in episodes if e.module_id in self.trainable]
        batch = self.pipeline(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data=shared)
        config = self.config.at(self.env_steps)
        batches: dict[str, dict[str, Any]] = {}  # the modules with steps left to train on
        real, stale, staleness = 0, 0, []
        for module_id, module_batch in batch.items():
            valid = module_batch[Columns.LOSS_MASK].bool()
            mask = valid
            if Columns.MODEL_VERSION in module_batch:
                lag = (self.module_versions[module_id] - module_batch.pop(Columns.MODEL_VERSION)).float()
                mask = valid & (lag <= self.max_staleness)
                staleness.append(lag[mask])
            module_batch[Columns.LOSS_MASK] = mask
            real += int(valid.sum())
            stale += int(valid.sum()) - int(mask.sum())
            if mask.any():
                batches[module_id] = module_batch
        parts: dict[str, dict[str, float]] = {}
        for index, (module_id, module_batch) in enumerate(batches.items()):
            if self.group is not None:  # every rank trains the module on its shard of the module's real rows
                rows = real_rows(self.module[module_id], module_batch)
                module_batch = self.group.send_batch(
                    rows, self.env_steps, module=module_id, last=index == len(batches) - 1
                )
            parts[module_id] = self._train(module_id, module_batch, config)
        counts = {"env_steps": trained, "agent_steps": real, "stale_steps": stale, "untrained_steps": untrained}
        bad = self._finish()
        if bad:
            return {**counts, "skipped": skipped_reason(bad)}
        for module_id in parts:
            self.module_versions[module_id] += 1
        self.version += 1
        self.env_steps += trained
        stats: dict[str, Any] = {
            key: float(np.mean([p[key] for p in parts.values()])) for key in ("policy_loss", "vf_loss", "entropy", "kl")
        } if parts else {}  # fmt: skip
        lags = torch.cat(staleness) if staleness else torch.zeros(0)
        return {
            **stats,
            **scheduled_values(config),
            "modules": parts,
            **counts,
            "staleness": float(lags.mean()) if lags.numel() else 0.0,
            **collective_seconds(parts, self.group),
        }

    def _train(self, module_id: str, batch: dict[str, Any], config: PPOConfig) -> dict[str, float]:
        """PPO's epochs of one module on its batch (in a group, this rank's shard of it), with one update's
        hyper-parameters; the module's weights and optimizer state kept first, for `_finish` to undo. Its loss parts
        and, in a group, its seconds in collectives."""
        for param_group in self.optimizer[module_id].param_groups:
            param_group["lr"] = config.lr
        self._before[module_id] = Snapshot(self.module[module_id], self.optimizer[module_id])
        parts = ppo_update(self.module[module_id], self.optimizer[module_id], batch, config, self._rng, self.group)
        return parts if self.group is None else {**parts, **self.group.seconds}

    def _finish(self) -> list[str]:
        """After an update's last module: the non-finite tensors it left in any module (`module.name`), and then
        every module trained in it put back as it was; none: in a group, the weights checked against rank 0's."""
        before, self._before = self._before, {}
        bad = [f"{module_id}.{name}" for module_id, snapshot in before.items() for name in snapshot.nonfinite_now()]
        if bad:
            for snapshot in before.values():
                snapshot.restore()
        elif self.group is not None and before:
            self.group.check_identical(self.module)
        return bad


def collective_seconds(parts: dict[str, dict[str, float]], group: Group | None) -> dict[str, float]:
    """An update's seconds in collectives: each module's scatter_s and allreduce_s summed, and the final check_s
    (none outside a group)."""
    if group is None or not parts:
        return {}
    total = {key: sum(p[key] for p in parts.values()) for key in ("scatter_s", "allreduce_s")}
    return {**total, "check_s": group.seconds["check_s"]}
