"""Env-to-module pieces written the way RLlib's connector docs write them: loop over the episodes, read the latest
observation, write the new one back with `set_observations(at_indices=-1)`, return the batch untouched.

Named in run specs by import path ("support.docs_pieces:Name"). None of them says `accepts_batched_obs`: the
module must still see exactly what they wrote into the episodes (RLlib's contract).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.connectors import ConnectorV2


class AddLastRewardToObservations(ConnectorV2):
    """The docs' example: the latest reward (0.0 at an episode's start) appended to a Box observation."""

    def recompute_output_observation_space(self, input_observation_space: Any, input_action_space: Any) -> gym.Space:
        low = np.append(input_observation_space.low, -np.inf).astype(np.float32)
        high = np.append(input_observation_space.high, np.inf).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        for sa_episode in self.single_agent_episode_iterator(episodes):
            last_reward = sa_episode.get_rewards(-1) if len(sa_episode) > 0 else 0.0
            new_obs = np.append(sa_episode.get_observations(-1), np.float32(last_reward)).astype(np.float32)
            sa_episode.set_observations(new_data=new_obs, at_indices=-1)
        return batch


class ScaleObservations(ConnectorV2):
    """Observations times `factor`, same space shape: the case where a module fed the raw observations would
    train wrong without a word (its input still fits)."""

    def __init__(
        self, input_observation_space: Any = None, input_action_space: Any = None, *, factor: float = 10.0, **kwargs
    ) -> None:
        self.factor = factor
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list, **kwargs: Any) -> dict[str, Any]:
        for sa_episode in self.single_agent_episode_iterator(episodes):
            scaled = (np.asarray(sa_episode.get_observations(-1)) * self.factor).astype(np.float32)
            sa_episode.set_observations(new_data=scaled, at_indices=-1)
        return batch
