"""GeneralAdvantageEstimation: PPO's ADVANTAGES and VALUE_TARGETS, from one value forward pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.common.numpy_to_tensor import to_tensor
from rlgate.connectors.common.tensor_to_numpy import to_numpy
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.zero_padding import pad, unpad
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def compute_value_targets(
    values: np.ndarray,
    rewards: np.ndarray,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """GAE(gamma, lambda) value targets (advantages + values) of consecutive episodes' steps (1-D).

    The value after a terminated step is 0; the recursion stops at terminated and truncated steps, so
    each episode's last step bootstraps from the row after it (AddOneTsToEpisodesAndTruncate's extra
    step, holding the final observation's value).
    """
    non_terminal = 1.0 - terminateds.astype(np.float64)
    propagate = (non_terminal * (1.0 - truncateds)).tolist()
    next_values = np.append(values[1:], 0.0)
    deltas = (rewards + gamma * non_terminal * next_values - values).tolist()
    advantages = [0.0] * len(deltas)
    running, discount = 0.0, gamma * lambda_
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + discount * propagate[t] * running
        advantages[t] = running
    return (np.asarray(advantages) + values).astype(np.float32)


class GeneralAdvantageEstimation(ConnectorV2):
    """Add ADVANTAGES (standardised) and VALUE_TARGETS, as tensors on the values' device.

    Runs last in the learner pipeline (on the tensor batch), after AddOneTsToEpisodesAndTruncate ran
    first: calls `rl_module.compute_values(batch)` once (no grad), computes GAE per episode and
    standardises the advantages over the LOSS_MASK steps (RLlib 2.60 includes the extra steps' values
    in the mean and std). Zero-padded [N, T] batches of a stateful module are handled.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        gamma: float,
        lambda_: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.gamma = gamma
        self.lambda_ = lambda_

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
        with torch.no_grad():
            values_tensor = rl_module.compute_values(batch)
        episode_lens = [len(episode) for episode in episodes]

        def steps(data: Any) -> np.ndarray:
            return unpad(to_numpy(data), episode_lens)

        values = steps(values_tensor)
        value_targets = compute_value_targets(
            values,
            steps(batch[Columns.REWARDS]),
            steps(batch[Columns.TERMINATEDS]),
            steps(batch[Columns.TRUNCATEDS]),
            self.gamma,
            self.lambda_,
        )
        advantages = value_targets - values
        valid = steps(batch[Columns.LOSS_MASK]) if Columns.LOSS_MASK in batch else slice(None)
        advantages = (advantages - advantages[valid].mean()) / max(1e-4, advantages[valid].std())
        if values_tensor.ndim == 2:
            max_seq_len = values_tensor.shape[1]
            advantages = pad(advantages, episode_lens, max_seq_len)
            value_targets = pad(value_targets, episode_lens, max_seq_len)
        batch[Columns.ADVANTAGES] = to_tensor(advantages.astype(np.float32), values_tensor.device)
        batch[Columns.VALUE_TARGETS] = to_tensor(value_targets, values_tensor.device)
        return batch
