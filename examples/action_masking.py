"""An RLModule that never picks an illegal move: the default actor-critic with PettingZoo's action mask applied.

PettingZoo's classic games observe {"action_mask", "observation"}; flattened (FlattenObservations, keys in the
space's order) the mask is the first `action_space.n` values. Illegal actions get a logit of -1e9, so neither
sampling nor the greedy action picks them (RLlib's ActionMaskingTorchRLModule example does the same).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlgate.core.columns import Columns
from rlgate.models import ActorCriticModule, ModelConfig


class ActionMaskingModule(ActorCriticModule):
    """ActorCriticModule over the flat observation; logits of masked-out actions pushed to -1e9."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, action_space, ModelConfig.from_dict(model_config))
        self._n = int(action_space.n)

    def _masked(self, batch: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        legal = batch[Columns.OBS][..., : self._n] > 0.5
        outputs[Columns.ACTION_DIST_INPUTS] = outputs[Columns.ACTION_DIST_INPUTS].masked_fill(~legal, -1e9)
        return outputs

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._masked(batch, super()._forward(batch))

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._masked(batch, super()._forward_train(batch))
