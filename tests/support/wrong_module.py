"""A user's RLModule with a bug: more logits than its Discrete action space has actions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from examples.tiny_module import TinyActorCritic
from rlgate.core.columns import Columns


class WrongLogits(TinyActorCritic):
    """TinyActorCritic with 2 logits too many: its Categorical would sample actions the env does not have."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict[str, Any]) -> None:
        super().__init__(observation_space, gym.spaces.Discrete(int(action_space.n) + 2), model_config)
        self.action_space = action_space


class LogitsNotDistInputs(TinyActorCritic):
    """TinyActorCritic whose greedy forward returns `logits` (another library's name) for action_dist_inputs."""

    def _forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"logits": self._forward(batch)[Columns.ACTION_DIST_INPUTS]}


class ForgetsItsState(TinyActorCritic):
    """A stateful module (it says so) whose forwards return no state_out: the server could not carry its state."""

    def is_stateful(self) -> bool:
        return True

    def get_initial_state(self) -> dict[str, torch.Tensor]:
        return {"h": torch.zeros(4)}

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.body(batch[Columns.OBS][:, -1]))}
