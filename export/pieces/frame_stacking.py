"""FrameStackingEnvToModule folded: the previous frames are state, carried by the graph from step to step."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlgate.connectors.common.frame_stacking import FrameStacking
from rlgate.export.folded import Folded, piece_spaces


class FoldedFrameStacking(Folded):
    """The observation stacked with the `num_frames - 1` before it along its last axis (zeros before the episode
    began), as `stack_frames` stacks them. State `frames`: those earlier frames, [num_frames - 1, *frame shape],
    oldest first."""

    def __init__(self, piece: FrameStacking, agent: str | None) -> None:
        super().__init__()
        space = piece_spaces(piece, agent)[0]
        self.k = piece.num_frames
        if self.k > 1:
            self.initial_state = {"frames": np.zeros((self.k - 1, *space.shape), space.dtype)}

    def forward(self, obs: Any, state: dict[str, torch.Tensor], reward: torch.Tensor | None) -> tuple[Any, dict]:
        if self.k == 1:
            return obs, state
        frames = torch.cat([state["frames"], obs.unsqueeze(1)], dim=1)  # [B, k, ..., d], oldest first
        stacked = frames.movedim(1, -2).flatten(-2)  # [B, ..., k * d]: each frame's d values together
        return stacked, {**state, "frames": frames[:, 1:]}
