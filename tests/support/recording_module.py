"""RecordingModule: the default actor-critic that keeps every observation batch its sampling forward acts on, so a
test sees exactly what a served module's input was."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.columns import Columns
from rlgate.models import ActorCriticModule, ModelConfig

#: The OBS of every exploring forward in this process, in order ([B, ...] numpy arrays).
SEEN: list[np.ndarray] = []


class RecordingModule(ActorCriticModule):
    """ActorCriticModule (the run spec's `model.config` as its ModelConfig) recording its exploring inputs."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, action_space, ModelConfig.from_dict(model_config))

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        SEEN.append(batch[Columns.OBS].numpy().copy())
        return super().forward_exploration(batch)
