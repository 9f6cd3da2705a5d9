"""A user's RLModule with a bug: more logits than its Discrete action space has actions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from examples.tiny_module import TinyActorCritic


class WrongLogits(TinyActorCritic):
    """TinyActorCritic with 2 logits too many: its Categorical would sample actions the env does not have."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, gym.spaces.Discrete(int(action_space.n) + 2), model_config)
        self.action_space = action_space
