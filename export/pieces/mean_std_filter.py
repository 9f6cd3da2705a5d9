"""MeanStdFilter folded: each Box part normalised with the statistics frozen at export, as the piece computes it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.env_to_module.mean_std_filter import MeanStdFilter, RunningStats
from rlgate.core.errors import UserError
from rlgate.core.spaces import space_struct
from rlgate.core.tree import flatten, map_structure
from rlgate.export.folded import Folded, piece_spaces, torch_dtype


class FoldedMeanStdFilter(Folded):
    """(obs - mean) / (std + 1e-8), clipped to +-clip_by_value, per Box part, in float64 and then cast to the
    part's dtype: the piece's own arithmetic, so the graph's observations equal the piece's bit for bit. The
    statistics are the piece's global ones merged with its delta (what it normalises with), as constants."""

    def __init__(self, piece: MeanStdFilter, agent: str | None) -> None:
        super().__init__()
        space = piece_spaces(piece, agent)[0]
        state = piece.get_state()
        if agent is not None:
            state = state[agent]
        self.struct = space_struct(space)
        self.de_mean, self.de_std, self.clip = piece.de_mean_to_zero, piece.de_std_to_one, piece.clip_by_value
        boxes = [leaf for leaf in flatten(self.struct) if isinstance(leaf, gym.spaces.Box)]
        for i, (stats, delta) in enumerate(zip(state["global"], state["delta"], strict=True)):
            merged = RunningStats.from_state(stats).merge(RunningStats.from_state(delta))
            self.register_buffer(f"mean{i}", torch.from_numpy(np.asarray(merged.mean, np.float64)))
            self.register_buffer(f"scale{i}", torch.from_numpy(np.asarray(merged.std + 1e-8, np.float64)))
        if len(boxes) != len(state["global"]):
            raise UserError(f"MeanStdFilter's statistics cover {len(state['global'])} Box parts, not {len(boxes)}")

    def forward(self, obs: Any, state: dict[str, torch.Tensor], reward: torch.Tensor | None) -> tuple[Any, dict]:
        boxes = iter(range(len(self._buffers) // 2))

        def normalise(space: gym.Space, leaf: torch.Tensor) -> torch.Tensor:
            if not isinstance(space, gym.spaces.Box):
                return leaf
            i = next(boxes)
            mean, scale = self._buffers[f"mean{i}"], self._buffers[f"scale{i}"]
            assert mean is not None and scale is not None  # registered for each Box leaf
            out = leaf.double()
            if self.de_mean:
                out = out - mean
            if self.de_std:
                out = out / scale
            if self.clip is not None:
                out = out.clamp(-self.clip, self.clip)
            return out.to(torch_dtype(space.dtype))

        return map_structure(normalise, self.struct, obs), state
