"""A user's RLModule written as RLlib's TorchRLModule subclasses are: layers built in `setup()` (skipping the value
head where `inference_only`), separate inference and exploration forwards, no distribution method (RLlib's default
for a Discrete action space: a Categorical).

Its two forwards are told apart by what they pick: the exploration forward all but forces action 0, the inference
(greedy) forward action 1, so which one a server ran shows in every action it answers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.models import RLModule

FORCE = 1e4  # added to the chosen logit: e**-10000 is 0 in float32


class RLlibStyleModule(RLModule):
    def setup(self) -> None:
        hidden = int(self.model_config.get("hidden", 16))
        self.body = nn.Sequential(nn.Linear(self.observation_space.shape[0], hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, int(self.action_space.n))
        if not self.inference_only:
            self.vf = nn.Linear(hidden, 1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.body(batch[Columns.OBS]))}

    def _forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        return _forcing(self._forward(batch), 0)

    def _forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        return _forcing(self._forward(batch), 1)

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.vf(self.body(batch[Columns.OBS])).squeeze(-1)


def _forcing(outputs: dict[str, Any], action: int) -> dict[str, Any]:
    logits = outputs[Columns.ACTION_DIST_INPUTS].clone()
    logits[..., action] += FORCE
    return {**outputs, Columns.ACTION_DIST_INPUTS: logits}
