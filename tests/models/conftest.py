"""Helpers shared by the model tests, as fixtures (test modules cannot import each other)."""

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.models import RLModule


@pytest.fixture
def sample_obs() -> Callable[..., torch.Tensor]:
    """sample_obs(space, *leading_dims): seeded random observations with leading (batch, time) dims."""

    def sample(space: gym.Space, *leading: int) -> torch.Tensor:
        space.seed(0)
        samples = np.stack([space.sample() for _ in range(int(np.prod(leading)))])
        return torch.as_tensor(samples).reshape(*leading, *space.shape)

    return sample


@pytest.fixture
def initial_state() -> Callable[[RLModule, int], dict[str, torch.Tensor]]:
    """initial_state(module, batch_size): the module's initial state, batched as STATE_IN."""

    def batched(module: RLModule, batch_size: int) -> dict[str, torch.Tensor]:
        return {k: v.expand(batch_size, *v.shape).clone() for k, v in module.get_initial_state().items()}

    return batched
