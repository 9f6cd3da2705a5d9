"""An RLModule that takes as long to build as a test wants: its constructor waits for `GO`."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym

from rlgate.models.actor_critic import ActorCriticModule
from rlgate.models.config import ModelConfig

BUILDING = threading.Event()  # set when a BlockingModule starts to build
GO = threading.Event()  # the build goes on once a test sets it


class BlockingModule(ActorCriticModule):
    """The default actor-critic, built only once `GO` is set (at most 30 s later: a test never hangs)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        BUILDING.set()
        if not GO.wait(30):
            raise TimeoutError("BlockingModule: nobody set GO")
        super().__init__(observation_space, action_space, ModelConfig.from_dict(model_config))
