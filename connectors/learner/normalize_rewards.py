"""NormalizeRewards: rewards scaled by the running spread of discounted returns (SB3's reward normalisation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.mean_std_filter import RunningStats

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class NormalizeRewards(ConnectorV2):
    """Divide every reward by the running standard deviation of the discounted return and clip it to
    +-`clip`, as Stable-Baselines3's `VecNormalize(norm_reward=True)` does (rl-zoo's `normalize: true`).

    A learner piece: the servers and the env keep raw rewards (returns in metrics and logs stay real);
    only what GAE and the value function see is scaled. The return statistics (RLlib's running
    statistics, merged chunk by chunk) grow with every batch. Difference from SB3: the discounted return
    starts at 0 at each chunk's first step instead of running on from the chunk before (a learner's chunks
    arrive out of order and are renamed by AddOneTsToEpisodesAndTruncate).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        gamma: float = 0.99,
        clip: float = 10.0,
        epsilon: float = 1e-8,
        **kwargs: Any,
    ) -> None:
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self._returns = RunningStats.zeros(())
        super().__init__(input_observation_space, input_action_space, **kwargs)

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
        rewards = [np.asarray(episode.get_rewards(), np.float64) for episode in episodes]
        for chunk in rewards:
            if len(chunk):
                self._returns = self._returns.merge(RunningStats.of(_discounted_returns(chunk, self.gamma)))
        scale = np.sqrt(np.square(self._returns.std) + self.epsilon)
        for episode, chunk in zip(episodes, rewards, strict=True):
            if len(chunk):
                episode.set_rewards(new_data=np.clip(chunk / scale, -self.clip, self.clip).astype(np.float32))
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"returns": self._returns.to_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._returns = RunningStats.from_state(state["returns"])


def _discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t-1}, from G_{-1} = 0: the running return SB3 normalises by."""
    returns = np.empty_like(rewards)
    running = 0.0
    for t, reward in enumerate(rewards):
        running = running * gamma + reward
        returns[t] = running
    return returns
