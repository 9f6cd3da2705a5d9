"""TensorToNumpy: the module's output tensors as numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def to_numpy(struct: Any) -> Any:
    """`struct` with every tensor leaf as a numpy array (detached, on the CPU), reduced as RLlib's
    `convert_to_numpy` reduces them: floating arrays (float16, float64) to float32 and int64 arrays to
    int32, numpy arrays already in `struct` too; a 0-d tensor becomes a Python number. Other integer
    types, unsigned ones and bool keep their dtype. RLlib uses it where rlgate does: TensorToNumpy, the
    initial states of AddStatesFromEpisodesToBatch and GAE's value predictions.
    """
    if isinstance(struct, torch.Tensor):  # the usual column: spares map_structure's Mapping (ABC) check
        return _to_numpy(struct)
    return map_structure(_to_numpy, struct)


# The dtypes RLlib's reduction changes (a dict lookup: cheaper than asking numpy per leaf on the fast path).
_REDUCED = {
    np.dtype(np.float16): np.float32,
    np.dtype(np.float64): np.float32,
    np.dtype(np.longdouble): np.float32,
    np.dtype(np.int64): np.int32,
}


def _to_numpy(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        if not leaf.ndim:
            return leaf.item()
        leaf = leaf.numpy(force=True)  # detach and copy to the CPU in one call
    if isinstance(leaf, np.ndarray):
        reduced = _REDUCED.get(leaf.dtype)
        if reduced is not None:
            return leaf.astype(reduced)
    return leaf


class TensorToNumpy(ConnectorV2):
    """Convert every tensor in the batch (nested ones included) to a numpy array, with RLlib's dtype
    reduction (`to_numpy`): e.g. a Discrete action sampled as int64 leaves as int32."""

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return {column: to_numpy(data) for column, data in batch.items()}
