"""FlattenObservations folded: every leaf of the observation in one [B, n] float32 row, discrete parts one-hot."""

from __future__ import annotations

from typing import Any

import torch

from rlgate.connectors.env_to_module import FlattenObservations
from rlgate.core.spaces import space_struct
from rlgate.core.tree import flatten, map_structure
from rlgate.export.folded import Folded, flat_leaf, piece_spaces


class FoldedFlattenObservations(Folded):
    """The leaves in the space's order (`flatten_batch`'s): Discrete and MultiDiscrete ones one-hot (start
    subtracted), Box and MultiBinary ones flattened, all float32 and concatenated."""

    def __init__(self, piece: FlattenObservations, agent: str | None) -> None:
        super().__init__()
        self.struct = space_struct(piece_spaces(piece, agent)[0])

    def forward(self, obs: Any, state: dict[str, torch.Tensor], reward: torch.Tensor | None) -> tuple[Any, dict]:
        ordered = map_structure(lambda _, leaf: leaf, self.struct, obs)  # in the space's key order
        parts = [flat_leaf(space, leaf) for space, leaf in zip(flatten(self.struct), flatten(ordered), strict=True)]
        return torch.cat(parts, dim=1), state
