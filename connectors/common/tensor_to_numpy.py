"""TensorToNumpy: the module's output tensors as numpy arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def to_numpy(struct: Any) -> Any:
    """`struct` with every tensor leaf replaced by a numpy array (detached, on the CPU)."""
    return map_structure(lambda x: x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, struct)


class TensorToNumpy(ConnectorV2):
    """Convert every tensor in the batch (nested ones included) to a numpy array."""

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: list[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return {column: to_numpy(data) for column, data in batch.items()}
