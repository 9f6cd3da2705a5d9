"""TinyActorCritic: a user's own RLModule, configured by the run spec's `model.config` dict."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.models import Categorical, Distribution, RLModule


class TinyActorCritic(RLModule):
    """One shared hidden layer of `model_config["hidden"]` units, a policy head and a value head
    (Discrete actions)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, action_space, model_config)
        hidden = int(model_config.get("hidden", 32))
        self.body = nn.Sequential(nn.Linear(observation_space.shape[0], hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, int(action_space.n))
        self.vf = nn.Linear(hidden, 1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.body(batch[Columns.OBS]))}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        features = self.body(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: self.pi(features), Columns.VF_PREDS: self.vf(features).squeeze(-1)}

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.vf(self.body(batch[Columns.OBS])).squeeze(-1)

    def get_train_action_dist_cls(self) -> type[Distribution]:
        return Categorical
