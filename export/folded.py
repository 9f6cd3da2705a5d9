"""Folded: an env-to-module connector piece as graph operations, for an exported policy (see `pieces`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class Folded(nn.Module):
    """What one env-to-module piece does to the latest observations of a batch, in torch ops a trace records.

    `forward(obs, state, reward)`: the piece's input observations ([B, ...] tensors, nested as its input space),
    the state it carries from the previous step (`initial_state` names each part and gives its value per row
    at an episode's start) and the reward for the previous action ([B] float32, where `uses_reward`) -> its output
    observations and its state after this step. `after_actions(state, actions)` updates that state with the
    actions chosen (previous actions are state).
    """

    uses_reward = False

    def __init__(self) -> None:
        super().__init__()
        self.initial_state: dict[str, np.ndarray] = {}

    def forward(
        self, obs: Any, state: dict[str, torch.Tensor], reward: torch.Tensor | None
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def after_actions(self, state: dict[str, torch.Tensor], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        return state


def one_hot(indices: torch.Tensor, depth: int) -> torch.Tensor:
    """float32 [..., depth] with a 1 at each index (core.spaces.one_hot's rows), as Equal and Cast nodes."""
    return (indices.long().unsqueeze(-1) == torch.arange(depth)).float()


def flat_leaf(space: gym.Space, leaf: torch.Tensor) -> torch.Tensor:
    """[B, n] float32: a batch of one leaf space's values flattened, Discrete and MultiDiscrete ones one-hot (the
    start subtracted), as FlattenObservations flattens observations and episodes one-hot previous actions."""
    rows = leaf.shape[0]
    if isinstance(space, gym.spaces.Discrete):
        return one_hot(leaf - int(space.start), int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        flat = (leaf - torch.from_numpy(space.start.astype(np.int64))).reshape(rows, -1)
        return torch.cat([one_hot(flat[:, i], int(n)) for i, n in enumerate(space.nvec.reshape(-1))], dim=1)
    return leaf.reshape(rows, -1).float()


def piece_spaces(piece: Any, agent: str | None) -> tuple[Any, Any, Any]:
    """A piece's input observation space, output observation space and input action space; in a multi-agent
    pipeline (spaces by agent id), `agent`'s."""
    spaces = (piece.input_observation_space, piece.observation_space, piece.input_action_space)
    return spaces if agent is None else tuple(space[agent] for space in spaces)


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (same names: float32, int64, bool, ...)."""
    return getattr(torch, np.dtype(dtype).name)
