"""NumpyToTensor: the batch's arrays as torch tensors on the module's device, converted once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_rl_module
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def to_tensor(value: Any, device: torch.device | str = "cpu") -> torch.Tensor:
    """One array (or number) as a tensor on `device`, sharing memory on the CPU; float64 becomes float32."""
    if not isinstance(value, torch.Tensor):
        array = np.asarray(value)
        # torch.from_numpy warns on read-only arrays (e.g. views of wire bytes): copy those.
        value = torch.from_numpy(array if array.flags.writeable else array.copy())
    if value.dtype == torch.float64:
        value = value.float()
    return value if value.device == device else value.to(device)


class NumpyToTensor(ConnectorV2):
    """Convert every column (nested arrays included) to torch tensors on `device`; INFOS stay as they are.

    Runs after BatchIndividualItems, so each column is one array and converts with one call. A MultiRLModule's
    batch `{module id: {column: array}}` is converted module by module.
    """

    accepts_batched_obs = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.device = torch.device(device)

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
        if is_multi_rl_module(rl_module):
            return {module_id: self._columns(data) for module_id, data in batch.items()}
        return self._columns(batch)

    def _columns(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {
            column: data if column == Columns.INFOS else map_structure(self._convert, data)
            for column, data in batch.items()
        }

    def _convert(self, value: Any) -> torch.Tensor:
        return to_tensor(value, self.device)
