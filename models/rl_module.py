"""RLModule: the contract between connectors, learners and a model (RLlib's RLModule + ValueFunctionAPI)."""

import abc
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlgate.models.config import ModelConfig
from rlgate.models.distributions import Distribution


class RLModule(nn.Module, abc.ABC):
    """A torch model with RLlib's new-API-stack RLModule methods.

    A batch is a dict of tensors keyed by Columns: OBS [B, ...], or for a stateful module OBS [B, T, ...]
    plus STATE_IN (a dict of [B, ...] tensors). The forward methods return ACTION_DIST_INPUTS and
    (stateful only) STATE_OUT; the train forward may add more (the default module adds VF_PREDS). As in
    RLlib, sampling needs no value estimates: the learner computes them with `compute_values`.
    Subclasses implement `_forward`, `compute_values` and `get_train_action_dist_cls`; inference and
    exploration share `_forward`, the train forward is `_forward_train` (by default `_forward`), and the
    inference and exploration distributions are the train one (callers use `to_deterministic()` for
    greedy actions). `model_config` is the default catalog's ModelConfig, or for a user's module the
    run spec's `model.config` dict (read either as `model_config["key"]`, as in RLlib).
    """

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig | dict[str, Any]
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.model_config = model_config

    @abc.abstractmethod
    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind forward_inference and forward_exploration."""

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind forward_train."""
        return self._forward(batch)

    @abc.abstractmethod
    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        """Value estimates [B] ([B, T] when stateful) for the batch's observations."""

    @abc.abstractmethod
    def get_train_action_dist_cls(self) -> type[Distribution]:
        """The distribution class of ACTION_DIST_INPUTS, bound to the action space."""

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._forward(batch)

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._forward(batch)

    def forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._forward_train(batch)

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """nn.Module's call (e.g. through DistributedDataParallel) is the train forward."""
        return self.forward_train(batch)

    def get_initial_state(self) -> dict[str, torch.Tensor]:
        """The recurrent state an episode starts from, unbatched; {} for a stateless module."""
        return {}

    def is_stateful(self) -> bool:
        return bool(self.get_initial_state())

    def get_inference_action_dist_cls(self) -> type[Distribution]:
        return self.get_train_action_dist_cls()

    def get_exploration_action_dist_cls(self) -> type[Distribution]:
        return self.get_train_action_dist_cls()
