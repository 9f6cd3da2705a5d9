"""PrevActionsPrevRewards: the last n actions and rewards added to each observation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import batch_items
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class PrevActionsPrevRewards(ConnectorV2):
    """Turn each latest observation into a Dict: the original observation under `_orig_obs`, the last
    `n_prev_actions` actions (flattened, Discrete/MultiDiscrete one-hot) under `prev_n_actions` and the
    last `n_prev_rewards` rewards under `prev_n_rewards`, zero-filled before the episode's first step.

    Written back into the episodes (as RLlib does), so they must be in list mode; the fast path's batched
    OBS becomes the batched Dict. Needs both input spaces (the action space sizes `prev_n_actions`).
    """

    ORIG_OBS_KEY = "_orig_obs"
    PREV_ACTIONS_KEY = "prev_n_actions"
    PREV_REWARDS_KEY = "prev_n_rewards"

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        n_prev_actions: int = 1,
        n_prev_rewards: int = 1,
        **kwargs: Any,
    ) -> None:
        self.n_prev_actions = n_prev_actions
        self.n_prev_rewards = n_prev_rewards
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        if input_action_space is None:
            return input_observation_space
        spaces = {self.ORIG_OBS_KEY: input_observation_space}
        if self.n_prev_actions:
            if isinstance(input_action_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
                size = int(np.sum(getattr(input_action_space, "nvec", input_action_space.n)))
                low, high = 0.0, 1.0
            else:
                size, low, high = int(np.prod(input_action_space.shape)), -np.inf, np.inf
            spaces[self.PREV_ACTIONS_KEY] = gym.spaces.Box(low, high, (self.n_prev_actions * size,), np.float32)
        if self.n_prev_rewards:
            spaces[self.PREV_REWARDS_KEY] = gym.spaces.Box(-np.inf, np.inf, (self.n_prev_rewards,), np.float32)
        return gym.spaces.Dict(spaces)

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
        if not episodes:
            return batch
        augmented = {self.ORIG_OBS_KEY: get_latest_observations(batch, episodes)}
        if self.n_prev_actions:
            augmented[self.PREV_ACTIONS_KEY] = batch_items([self._prev_actions(e) for e in episodes])
        if self.n_prev_rewards:
            augmented[self.PREV_REWARDS_KEY] = batch_items([self._prev_rewards(e) for e in episodes])
        set_latest_observations(batch, episodes, augmented, self.observation_space)
        return batch

    def _prev_actions(self, episode: SingleAgentEpisode) -> np.ndarray:
        actions = episode.get_actions(slice(-self.n_prev_actions, None), fill=0.0, one_hot_discrete=True)
        return np.asarray(actions, np.float32).reshape(-1)

    def _prev_rewards(self, episode: SingleAgentEpisode) -> np.ndarray:
        return np.asarray(episode.get_rewards(slice(-self.n_prev_rewards, None), fill=0.0), np.float32)
