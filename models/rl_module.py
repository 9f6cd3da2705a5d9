"""RLModule: the contract between connectors, learners and a model (RLlib's RLModule + ValueFunctionAPI)."""

import abc
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlgate.models.catalog import action_distribution
from rlgate.models.config import ModelConfig
from rlgate.models.distributions import Distribution


class RLModule(nn.Module, abc.ABC):
    """A torch model with RLlib's new-API-stack RLModule methods.

    A batch is a dict of tensors keyed by Columns: OBS [B, ...], or for a stateful module OBS [B, T, ...]
    plus STATE_IN (a dict of [B, ...] tensors). The forward methods return ACTION_DIST_INPUTS and
    (stateful only) STATE_OUT; the train forward may add VF_PREDS (the default module does), which PPO's loss
    then takes instead of calling `compute_values` (as RLlib's does). As in RLlib, sampling needs no value
    estimates: the learner computes them with `compute_values`.

    Subclasses implement `_forward` and `compute_values`, and build their layers in `__init__` (after
    `super().__init__`) or, as in RLlib, in `setup()`, which the constructor calls last. As in RLlib,
    `forward_inference`, `forward_exploration` and `forward_train` call `_forward_inference`,
    `_forward_exploration` and `_forward_train`, each `_forward` unless overridden. The distribution: set
    `action_dist_cls` (as in RLlib) or override `get_train_action_dist_cls`, by default the catalog's for the
    action space (Categorical, MultiCategorical, DiagGaussian); the inference and exploration distributions
    are the train one unless overridden (callers use `to_deterministic()` for greedy actions).
    `model_config` is the default catalog's ModelConfig, or for a user's module the run spec's
    `model.config` dict (read either as `model_config["key"]`, as in RLlib). `inference_only` is always
    False: every server and learner builds the whole module (RLlib's modules read it in `setup()`).
    """

    action_dist_cls: type[Distribution] | None = None
    inference_only = False

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig | dict[str, Any]
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.model_config = model_config
        self.setup()

    def setup(self) -> None:
        """Build the layers (RLlib's way; or in `__init__`): called by the constructor, once the spaces and
        `model_config` are set."""

    @abc.abstractmethod
    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind the others, unless they are overridden."""

    def _forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind forward_inference (greedy actions)."""
        return self._forward(batch)

    def _forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind forward_exploration (sampled actions)."""
        return self._forward(batch)

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The forward pass behind forward_train."""
        return self._forward(batch)

    @abc.abstractmethod
    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        """Value estimates [B] ([B, T] when stateful) for the batch's observations."""

    def get_train_action_dist_cls(self) -> type[Distribution]:
        """The distribution class of ACTION_DIST_INPUTS, bound to the action space: `action_dist_cls` if set,
        else the catalog's for the action space (UnsupportedSpace, a ValueError, where it has none)."""
        if self.action_dist_cls is None:  # looked up once: a MultiDiscrete space's is a class bound to its nvec
            self.action_dist_cls = action_distribution(self.action_space)[0]
        return self.action_dist_cls

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._forward_inference(batch)

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._forward_exploration(batch)

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
