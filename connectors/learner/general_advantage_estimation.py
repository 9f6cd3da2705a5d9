"""GeneralAdvantageEstimation: PPO's ADVANTAGES and VALUE_TARGETS, from one value forward pass (V-trace
corrected for steps sampled by a model more than one version behind)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.common.numpy_to_tensor import to_tensor
from rlgate.connectors.common.tensor_to_numpy import to_numpy
from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_rl_module
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


def compute_vtrace_targets(
    values: np.ndarray,
    rewards: np.ndarray,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    log_rhos: np.ndarray,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """V-trace value targets (IMPALA, Espeholt et al. 2018) of consecutive episodes' steps (1-D), with
    truncated importance weights rho = min(1, pi/mu) and traces c = lambda * min(1, pi/mu), where log_rhos
    is log pi - log mu per step. With pi == mu they are exactly GAE(gamma, lambda)'s targets."""
    ratios = np.minimum(1.0, np.exp(log_rhos))
    non_terminal = 1.0 - terminateds.astype(np.float64)
    propagate = (non_terminal * (1.0 - truncateds) * lambda_ * ratios).tolist()
    next_values = np.append(values[1:], 0.0)
    deltas = (ratios * (rewards + gamma * non_terminal * next_values - values)).tolist()
    corrections = [0.0] * len(deltas)
    running = 0.0
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + gamma * propagate[t] * running
        corrections[t] = running
    return (np.asarray(corrections) + values).astype(np.float32)


class GeneralAdvantageEstimation(ConnectorV2):
    """Add ADVANTAGES (standardised) and VALUE_TARGETS, as tensors on the values' device.

    Runs last in the learner pipeline (on the tensor batch), after AddOneTsToEpisodesAndTruncate ran
    first: calls `rl_module.compute_values(batch)` once (no grad), computes GAE per episode and
    standardises the advantages over the LOSS_MASK steps (RLlib 2.60 includes the extra steps' values
    in the mean and std). Zero-padded [N, T] batches of a stateful module are handled.

    Off-policy correction: when `shared_data["learner_version"]` is given and an episode holds steps whose
    MODEL_VERSION lags it by more than one version, that episode's targets are V-trace's (with the
    module's current log-probabilities against the recorded ACTION_LOGP), as APPO does; PPO's ratio then
    still corrects the policy gradient. One version of lag (sampling overlapping training) keeps GAE.

    With a MultiRLModule, all of it per module (as RLlib): its values, its agents' episodes, its own
    standardisation, and its own version (`shared_data["learner_versions"][module id]`).
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
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        assert rl_module is not None  # the learner's module
        shared_data = shared_data or {}
        sa_episodes = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
        if is_multi_rl_module(rl_module):
            versions = shared_data.get("learner_versions", {})
            for module_id, module_batch in batch.items():
                lens = [len(e) for e in sa_episodes if e.module_id == module_id]
                self._add_advantages(rl_module[module_id], module_batch, lens, versions.get(module_id))
        else:
            self._add_advantages(rl_module, batch, [len(e) for e in sa_episodes], shared_data.get("learner_version"))
        return batch

    def _add_advantages(
        self, rl_module: RLModule, batch: dict[str, Any], episode_lens: list[int], version: int | None
    ) -> None:
        """ADVANTAGES and VALUE_TARGETS for one module's batch, whose steps are those of `episode_lens`;
        `version`: the module's version now (for the off-policy correction), if known."""
        with torch.no_grad():
            values_tensor = rl_module.compute_values(batch)

        def steps(data: Any) -> np.ndarray:
            return unpad(to_numpy(data), episode_lens)

        values = steps(values_tensor)
        columns = (steps(batch[Columns.REWARDS]), steps(batch[Columns.TERMINATEDS]), steps(batch[Columns.TRUNCATEDS]))
        value_targets = compute_value_targets(values, *columns, self.gamma, self.lambda_)
        lagging = self._lagging_rows(batch, episode_lens, version, steps)
        if lagging is not None:
            log_rhos = self._log_rhos(rl_module, batch, steps)
            if Columns.LOSS_MASK in batch:
                log_rhos = np.where(steps(batch[Columns.LOSS_MASK]), log_rhos, 0.0)  # the extra bootstrap steps
            vtrace = compute_vtrace_targets(values, *columns, log_rhos, self.gamma, self.lambda_)
            value_targets = np.where(lagging, vtrace, value_targets)
        advantages = value_targets - values
        valid = steps(batch[Columns.LOSS_MASK]) if Columns.LOSS_MASK in batch else slice(None)
        advantages = (advantages - advantages[valid].mean()) / max(1e-4, advantages[valid].std())
        if values_tensor.ndim == 2:
            max_seq_len = values_tensor.shape[1]
            advantages = pad(advantages, episode_lens, max_seq_len)
            value_targets = pad(value_targets, episode_lens, max_seq_len)
        batch[Columns.ADVANTAGES] = to_tensor(advantages.astype(np.float32), values_tensor.device)
        batch[Columns.VALUE_TARGETS] = to_tensor(value_targets, values_tensor.device)

    @staticmethod
    def _lagging_rows(
        batch: dict[str, Any], episode_lens: list[int], version: int | None, steps: Any
    ) -> np.ndarray | None:
        """Per step: whether its episode has steps more than one version behind the learner; None if none has."""
        if version is None or Columns.MODEL_VERSION not in batch:
            return None
        lag = version - steps(batch[Columns.MODEL_VERSION])
        bounds = np.cumsum([0, *episode_lens])
        per_episode = [bool((lag[a:b] > 1).any()) for a, b in pairwise(bounds)]
        if not any(per_episode):
            return None
        return np.repeat(per_episode, episode_lens)

    @staticmethod
    def _log_rhos(rl_module: RLModule, batch: dict[str, Any], steps: Any) -> np.ndarray:
        """log pi(a|s) - log mu(a|s): the module now against the behaviour policy that acted."""
        with torch.no_grad():
            outputs = rl_module.forward_train(batch)
            dist = rl_module.get_train_action_dist_cls().from_logits(outputs[Columns.ACTION_DIST_INPUTS])
            logp = dist.logp(batch[Columns.ACTIONS])
        return steps(logp) - steps(batch[Columns.ACTION_LOGP])
