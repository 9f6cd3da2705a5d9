"""TinyActorCritic: a user's own RLModule, configured by the run spec's `model.config` dict.

Written as an RLlib `TorchRLModule` with the `ValueFunctionAPI` is: layers built in `setup()`, no distribution
method (the catalog's for a Discrete action space: a Categorical).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.models import RLModule


class TinyActorCritic(RLModule):
    """One shared hidden layer of `model_config["hidden"]` units, a policy head and a value head
    (Discrete actions)."""

    def setup(self) -> None:
        hidden = int(self.model_config.get("hidden", 32))
        self.body = nn.Sequential(nn.Linear(self.observation_space.shape[0], hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, int(self.action_space.n))
        self.vf = nn.Linear(hidden, 1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.body(batch[Columns.OBS]))}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        features = self.body(batch[Columns.OBS])  # once for both heads: PPO's loss takes VF_PREDS from here
        return {Columns.ACTION_DIST_INPUTS: self.pi(features), Columns.VF_PREDS: self.vf(features).squeeze(-1)}

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.vf(self.body(batch[Columns.OBS])).squeeze(-1)
