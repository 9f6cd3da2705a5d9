"""The training step: episode chunks -> learner pipeline (with GAE) -> PPO epochs -> version + 1."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.ppo import ppo_update
from rlgate.learner.settings import LearnerSettings
from rlgate.models import RLModule


class Trainer:
    """Owns the module being trained, its optimizer and the learner pipeline."""

    def __init__(
        self,
        module: RLModule,
        settings: LearnerSettings,
        *,
        version: int = 0,
        optimizer_state: dict[str, Any] | None = None,
        env_steps: int = 0,
    ) -> None:
        self.module = module
        self.version = version
        self.env_steps = env_steps  # trained on by every update since version 0 (kept in checkpoints)
        self.max_staleness = settings.max_staleness
        self.config = settings.ppo()
        self.optimizer = torch.optim.Adam(module.parameters(), lr=self.config.lr, eps=1e-5)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.pipeline = build_learner_pipeline(
            module.observation_space, module.action_space, gae=(self.config.gamma, self.config.lambda_)
        )
        self._rng = np.random.default_rng(settings.seed)

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.module.observation_space, self.module.action_space

    def update(self, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
        """One PPO update on these chunks; steps chosen more than max_staleness versions ago don't count."""
        batch = self.pipeline(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data={})
        mask = batch[Columns.LOSS_MASK].bool()
        real_steps = int(mask.sum())
        staleness = torch.zeros_like(mask, dtype=torch.float32)
        if Columns.MODEL_VERSION in batch:
            staleness = (self.version - batch.pop(Columns.MODEL_VERSION)).float()
            mask = mask & (staleness <= self.max_staleness)
        batch[Columns.LOSS_MASK] = mask
        used = int(mask.sum())
        stats = ppo_update(self.module, self.optimizer, batch, self.config, self._rng) if used else {}
        self.version += 1
        self.env_steps += real_steps
        return {
            **stats,
            "env_steps": real_steps,
            "stale_steps": real_steps - used,
            "staleness": float(staleness[batch[Columns.LOSS_MASK]].mean()) if used else 0.0,
        }
