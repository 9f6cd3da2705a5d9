"""ObservedModule: the default actor-critic, recording every observation batch that reaches it (dtype, shape and
the pixel at (0, 0) of each row), for tests that check what the pipelines hand the module, in one process."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import torch

from rlgate.core.columns import Columns
from rlgate.models import ModelConfig
from rlgate.models.actor_critic import ActorCriticModule


class ObservedModule(ActorCriticModule):
    #: (forward, dtype, shape, the pixel at (0, 0) of every row: [rows, channels]) per batch, class-wide.
    seen: ClassVar[list[tuple[str, torch.dtype, tuple[int, ...], torch.Tensor]]] = []

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, action_space, ModelConfig.from_dict(model_config))

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        self._record("sample", batch)
        return super()._forward(batch)

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        self._record("train", batch)
        return super()._forward_train(batch)

    def _record(self, forward: str, batch: dict[str, Any]) -> None:
        obs = batch[Columns.OBS]
        self.seen.append((forward, obs.dtype, tuple(obs.shape), obs[:, 0, 0, :].detach().clone()))
