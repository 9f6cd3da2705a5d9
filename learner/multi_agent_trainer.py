"""The multi-agent training step: agents' chunks -> learner pipeline (per-module batches, GAE per module) ->
PPO on each trainable module with its own optimizer -> version + 1.

Each module has its own version (the number of updates that changed it); servers record it with every agent
step, so staleness is counted per module: steps chosen more than `max_staleness` versions of their module ago
are masked out. Modules not in `trainable` (policies_to_train) keep their weights and version: their agents'
chunks (a frozen opponent's, whose module may change from episode to episode) count towards the train batch,
as RLlib counts them, and are then set aside before the learner pipeline (RLlib's Learner drops their batches
after it), counted as `untrained_steps`. An update that leaves a non-finite value in any module is undone for
every module and skipped, as in the single-agent trainer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.adam import Adam
from rlgate.learner.ppo import ppo_update
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
        parts: dict[str, dict[str, float]] = {}
        before: dict[str, Snapshot] = {}
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
            if not mask.any():
                continue
            for group in self.optimizer[module_id].param_groups:
                group["lr"] = config.lr
            before[module_id] = Snapshot(self.module[module_id], self.optimizer[module_id])
            parts[module_id] = ppo_update(
                self.module[module_id], self.optimizer[module_id], module_batch, config, self._rng
            )
        counts = {"env_steps": trained, "agent_steps": real, "stale_steps": stale, "untrained_steps": untrained}
        bad = [f"{module_id}.{name}" for module_id, snapshot in before.items() for name in snapshot.nonfinite_now()]
        if bad:
            for snapshot in before.values():
                snapshot.restore()
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
        }
