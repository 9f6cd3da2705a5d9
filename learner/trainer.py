"""The training step: episode chunks -> learner pipeline (with GAE) -> PPO epochs -> version + 1.

An update that leaves a non-finite value in the module's weights or the optimizer's state is undone (both
go back to where they were) and skipped: the version stays, and nothing non-finite is ever published.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors import ConnectorPipelineV2
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.adam import Adam
from rlgate.learner.data_parallel import Group
from rlgate.learner.ppo import ppo_update, real_rows
from rlgate.models import RLModule
from rlgate.spec.algorithm import PPOConfig


class Trainer:
    """Owns the module being trained, its optimizer and the learner pipeline."""

    def __init__(
        self,
        module: RLModule,
        pipeline: ConnectorPipelineV2,
        config: PPOConfig,
        *,
        max_staleness: int,
        seed: int | None = None,
        version: int = 0,
        optimizer_state: dict[str, Any] | None = None,
        env_steps: int = 0,
    ) -> None:
        """`pipeline`: the learner connector pipeline (with GAE) that turns chunks into a train batch."""
        self.module = module
        self.pipeline = pipeline
        self.config = config
        self.version = version
        self.env_steps = env_steps  # trained on by every update since version 0 (kept in checkpoints)
        self.max_staleness = max_staleness
        lr = config.at(env_steps).lr
        self.optimizer = Adam(module.parameters(), lr)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
            for group in self.optimizer.param_groups:  # the spec's lr (schedule), not the checkpoint's
                group["lr"] = lr
        self._rng = np.random.default_rng(seed)
        self.group: Group | None = None  # the data-parallel learners this one trains with (`join`)

    def join(self, group: Group) -> None:
        """Train with the group's other ranks from now on, all from rank 0's weights and optimizer state."""
        group.share_state(self.module, self.optimizer)
        self.group = group

    def follow(self, header: dict[str, Any], shard: dict[str, torch.Tensor]) -> int:
        """A follower rank's part of the update rank 0 runs (data_parallel): PPO's epochs on its shard, with the
        hyper-parameters at rank 0's env steps. The updates it trained: 1, or 0 if undone."""
        return int("skipped" not in self.train(shard, self.config.at(header["env_steps"])))

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.module.observation_space, self.module.action_space

    def oldest_version(self) -> int:
        """The oldest model version whose steps still train (older ones are dropped before an update)."""
        return self.version - self.max_staleness

    def update(self, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
        """One PPO update on these chunks; steps chosen more than max_staleness versions ago don't count.

        The stats have "skipped" (why) when the update was undone for non-finite results."""
        shared = {"learner_version": self.version}  # GAE corrects steps sampled more than one version back
        batch = self.pipeline(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data=shared)
        mask = batch[Columns.LOSS_MASK].bool()
        real_steps = int(mask.sum())
        staleness = torch.zeros_like(mask, dtype=torch.float32)
        if Columns.MODEL_VERSION in batch:
            staleness = (self.version - batch.pop(Columns.MODEL_VERSION)).float()
            mask = mask & (staleness <= self.max_staleness)
        batch[Columns.LOSS_MASK] = mask
        used = int(mask.sum())
        config = self.config.at(self.env_steps)
        counts = {
            "env_steps": real_steps,
            "stale_steps": real_steps - used,
            "staleness": float(staleness[mask].mean()) if used else 0.0,
        }
        stats = {}
        if used:
            if self.group is not None:  # every rank trains on its shard of the batch's real rows
                batch = self.group.send_batch(real_rows(self.module, batch), self.env_steps)
            stats = self.train(batch, config)
            if "skipped" in stats:
                return {**counts, **stats}
        self.version += 1
        self.env_steps += real_steps
        return {**stats, **scheduled_values(config), **counts}

    def train(self, batch: dict[str, torch.Tensor], config: PPOConfig) -> dict[str, Any]:
        """PPO's epochs on a train batch (in a group of data-parallel learners, this rank's shard of it), with one
        update's hyper-parameters (`PPOConfig.at`); undone (weights and optimizer state as before) if they leave a
        non-finite value anywhere: then the stats are just "skipped", why. Every rank of a group runs it alike."""
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = config.lr
        before = Snapshot(self.module, self.optimizer)
        stats = ppo_update(self.module, self.optimizer, batch, config, self._rng, self.group)
        bad = before.nonfinite_now()
        if bad:
            before.restore()
            return {"skipped": skipped_reason(bad)}
        if self.group is not None:
            self.group.check_identical(self.module)
            stats.update(self.group.seconds)  # the update's seconds in collectives: scatter_s, allreduce_s, check_s
        return stats


def scheduled_values(config: Any) -> dict[str, float]:
    """One update's values of its algorithm's scheduled hyper-parameters (PPO's lr, clip_param, entropy_coeff), for
    its stats."""
    return {name: getattr(config, name) for name in config.SCHEDULED}


class Snapshot:
    """A module's weights and its optimizers' states before an update, to put back if the update left a
    non-finite value in any (shared by every trainer)."""

    def __init__(self, module: torch.nn.Module, *optimizers: Adam) -> None:
        self.module, self.optimizers = module, optimizers
        # The state dicts' tensors are the live ones: cloned (new dicts around them), a tenth of a deepcopy's cost.
        self._weights = map_structure(_copy, module.state_dict())
        self._optimizer_states = [map_structure(_copy, optimizer.state_dict()) for optimizer in optimizers]

    def nonfinite_now(self) -> list[str]:
        """Names of the tensors the module and optimizers hold now that are +-inf or NaN."""
        found = nonfinite_tensors(self.module.state_dict())
        for optimizer in self.optimizers:
            found += nonfinite_tensors(optimizer.state_dict()["state"])
        return found

    def restore(self) -> None:
        self.module.load_state_dict(self._weights)
        for optimizer, state in zip(self.optimizers, self._optimizer_states, strict=True):
            optimizer.load_state_dict(state)


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def skipped_reason(bad: list[str]) -> str:
    """The "skipped" stat of an undone update, naming the first few non-finite tensors."""
    more = ", ..." if len(bad) > 3 else ""
    return f"non-finite values in {len(bad)} tensors: {', '.join(bad[:3])}{more}"


def nonfinite_tensors(state: dict[Any, Any]) -> list[str]:
    """Names of the floating-point tensors in a (nested) state dict that hold +-inf or NaN. One device-to-host
    copy for them all (on a GPU, one sync an update rather than one a tensor)."""
    named = dict(_float_tensors(state, ""))
    if not named:
        return []
    device = next(iter(named.values())).device
    finite = torch.stack([torch.isfinite(tensor).all().to(device) for tensor in named.values()]).tolist()
    return [name for name, ok in zip(named, finite, strict=True) if not ok]


def _float_tensors(state: dict[Any, Any], prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating-point tensors of a (nested) state dict, by dotted name."""
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _float_tensors(value, f"{name}.")
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            yield name, value
