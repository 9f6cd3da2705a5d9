"""The module-to-env pipeline as graph operations: the action chosen from the module's distribution inputs
(GetActions: greedy, or sampled from a `noise` input), and that action made fit for the env
(NormalizeAndClipActions)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlgate.connectors import ConnectorPipelineV2
from rlgate.connectors.common import ModuleToAgentUnmapping, TensorToNumpy
from rlgate.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)
from rlgate.export.folded import torch_dtype
from rlgate.export.pieces import NotExportable
from rlgate.models import Categorical, DiagGaussian, MultiCategorical, RLModule

#: The module-to-env pieces an exported graph does: rlgate's defaults.
DEFAULT_PIECES = (
    GetActions,
    TensorToNumpy,
    UnBatchToIndividualItems,
    ModuleToAgentUnmapping,
    RemoveSingleTsTimeRankFromBatch,
    NormalizeAndClipActions,
    ListifyDataForVectorEnv,
)
#: The distributions whose sampling the graph does, and their noise: (distribution of the draws, greedy value).
NOISE = {Categorical: ("exponential", 1.0), MultiCategorical: ("exponential", 1.0), DiagGaussian: ("normal", 0.0)}
ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box)


def env_action_flags(module_to_env: ConnectorPipelineV2) -> dict[str, bool]:
    """NormalizeAndClipActions' flags in a module-to-env pipeline, whose every piece must be one of rlgate's defaults
    (NotExportable naming the first that is not): what `ActionSelection.for_env` does then is the whole pipeline."""
    flags = {"normalize_actions": False, "clip_actions": False}
    for i, piece in enumerate(module_to_env.connectors):
        if not isinstance(piece, DEFAULT_PIECES):
            raise NotExportable(
                f"connectors.module_to_env[{i}]: {type(piece).__name__} cannot be folded into an ONNX graph (only "
                "rlgate's default module-to-env pieces are): export the module alone with --module-only"
            )
        if isinstance(piece, NormalizeAndClipActions):
            flags = {"normalize_actions": piece.normalize_actions, "clip_actions": piece.clip_actions}
    return flags


class ActionSelection(nn.Module):
    """GetActions and NormalizeAndClipActions (with the pipeline's flags: `env_action_flags`), for one action
    space (the env's, or in a multi-agent run the agent's).

    `forward(dist_inputs, noise)` -> (the module's action [B, ...], its log-probability [B] or None): the
    inference distribution's deterministic action, or (`explore`) the exploration distribution's `sample_from`
    of the noise. `for_env(actions)`: unsquashed to the Box bounds (`normalize_actions`) or clipped to them
    (`clip_actions`), in float64 as `unsquash_action` computes, then the space's dtype.
    """

    low: torch.Tensor  # a Box's bounds (buffers)
    high: torch.Tensor

    def __init__(
        self,
        module: RLModule,
        action_space: gym.Space,
        explore: bool,
        *,
        normalize_actions: bool = False,
        clip_actions: bool = False,
    ) -> None:
        super().__init__()
        normalize, clip = normalize_actions, clip_actions
        if not isinstance(action_space, ACTION_SPACES):
            raise NotExportable(f"actions in {action_space} cannot be exported (Discrete, MultiDiscrete and Box can)")
        self.explore = explore
        self.dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
        family = next((f for f in NOISE if issubclass(self.dist_cls, f)), None)
        if explore and family is None:
            raise NotExportable(
                f"the module's exploration distribution {self.dist_cls.__name__} cannot sample in an ONNX graph "
                "(Categorical, MultiCategorical and DiagGaussian can): export without --explore"
            )
        self.noise_kind: str | None
        self.greedy_noise: float | None
        self.noise_kind, self.greedy_noise = NOISE[family] if family else (None, None)
        self.space = action_space
        box = isinstance(action_space, gym.spaces.Box)
        self.unsquash = isinstance(action_space, gym.spaces.Box) and normalize and action_space.is_bounded("both")
        self.clip = box and not normalize and clip
        if isinstance(action_space, gym.spaces.Box):
            self.register_buffer("low", torch.from_numpy(action_space.low.astype(np.float64)))
            self.register_buffer("high", torch.from_numpy(action_space.high.astype(np.float64)))

    def forward(self, dist_inputs: torch.Tensor, noise: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        dist = self.dist_cls.from_logits(dist_inputs)
        if not self.explore:
            return dist.to_deterministic().sample(), None
        return dist.sample_and_logp_from(noise)

    def for_env(self, actions: torch.Tensor) -> torch.Tensor:
        space = self.space
        if self.unsquash and np.issubdtype(space.dtype, np.floating):
            low, high = self.low / 2.0, self.high / 2.0
            out = (low + high) + actions.double() * (high - low)
            return torch.maximum(torch.minimum(out, self.high), self.low).to(torch_dtype(space.dtype))
        if self.unsquash:  # an integer Box: its low shifts the actions
            return (self.low + actions.double()).to(torch_dtype(space.dtype))
        if self.clip:
            return torch.maximum(torch.minimum(actions.double(), self.high), self.low).to(torch_dtype(space.dtype))
        return actions

    @property
    def adapts(self) -> bool:
        """Whether `for_env` changes the module's actions (a Box's, unsquashed or clipped)."""
        return bool(self.unsquash or self.clip)

    @property
    def noise_width(self) -> int:
        """The noise's values per row: one per logit (Discrete: n, MultiDiscrete: sum(nvec)), one per action
        dimension (Box)."""
        space = self.space
        if isinstance(space, gym.spaces.Discrete):
            return int(space.n)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return int(space.nvec.sum())
        return int(np.prod(space.shape))
