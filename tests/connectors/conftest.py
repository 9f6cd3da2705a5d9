"""Fixtures for connector tests: a tiny deterministic env, real episodes filled from it, and modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.models import Categorical, ModelConfig, RLModule, build_module


class CountingEnv(gym.Env):
    """Deterministic env (tianshou's test env style): obs [env_id, t], reward t + action / 2, done at `size`."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, env_id: int = 0, size: int = 5, truncate: bool = False) -> None:
        self.env_id, self.size, self.truncate = env_id, size, truncate
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        return self._obs(), {"t": 0}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        done = self.t >= self.size
        reward = self.t + action / 2
        return self._obs(), reward, done and not self.truncate, done and self.truncate, {"t": self.t}


def fill_episode(env: gym.Env, steps: int, extra: Callable[[int], dict[str, Any]] | None = None) -> SingleAgentEpisode:
    """A list-mode episode of `steps` env steps (or until done), actions t % 2, extra outputs extra(t)."""
    episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
    obs, info = env.reset()
    episode.add_env_reset(obs, info)
    for t in range(steps):
        action = t % 2
        obs, reward, terminated, truncated, info = env.step(action)
        episode.add_env_step(
            obs,
            action,
            reward,
            info,
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs=extra(t) if extra else None,
        )
        if terminated or truncated:
            break
    return episode


def default_extra(t: int) -> dict[str, Any]:
    return {Columns.ACTION_LOGP: np.float32(-0.1 * t), Columns.VF_PREDS: np.float32(t)}


@pytest.fixture
def make_episode() -> Callable[..., SingleAgentEpisode]:
    """make_episode(env_id=0, steps=3, size=5, truncate=False, extra=default_extra) -> a filled episode."""

    def make(
        env_id: int = 0, steps: int = 3, size: int = 5, truncate: bool = False, extra: Any = default_extra
    ) -> SingleAgentEpisode:
        return fill_episode(CountingEnv(env_id, size, truncate), steps, extra)

    return make


@pytest.fixture
def obs_space() -> gym.Space:
    return CountingEnv.observation_space


@pytest.fixture
def act_space() -> gym.Space:
    return CountingEnv.action_space


@pytest.fixture
def module(obs_space: gym.Space, act_space: gym.Space) -> RLModule:
    torch.manual_seed(0)
    return build_module(obs_space, act_space, ModelConfig(fcnet_hiddens=(8,)))


@pytest.fixture
def lstm_module(obs_space: gym.Space, act_space: gym.Space) -> RLModule:
    torch.manual_seed(0)
    config = ModelConfig(fcnet_hiddens=(8,), use_lstm=True, lstm_cell_size=4, max_seq_len=3)
    return build_module(obs_space, act_space, config)


class ObsValueModule(RLModule):
    """A module whose value of obs [id, t] is id + t / 10 and whose logits are zero (hand-checkable).

    With `stateful`, it takes [B, T, ...] batches (a dummy state), so the same values arrive zero-padded.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, stateful: bool = False) -> None:
        super().__init__(observation_space, action_space, ModelConfig(max_seq_len=3))
        self._stateful = stateful

    def get_initial_state(self) -> dict[str, torch.Tensor]:
        return {"h": torch.zeros(1)} if self._stateful else {}

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        return {
            Columns.ACTION_DIST_INPUTS: torch.zeros(*obs.shape[:-1], 2),
            Columns.VF_PREDS: self.compute_values(batch),
        }

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        obs = batch[Columns.OBS]
        return obs[..., 0] + obs[..., 1] / 10

    def get_train_action_dist_cls(self) -> type[Categorical]:
        return Categorical


@pytest.fixture
def value_module(obs_space: gym.Space, act_space: gym.Space) -> RLModule:
    return ObsValueModule(obs_space, act_space)


@pytest.fixture
def stateful_value_module(obs_space: gym.Space, act_space: gym.Space) -> RLModule:
    return ObsValueModule(obs_space, act_space, stateful=True)
