"""Shared fixtures for the episodes tests: both storage modes, nested spaces, episode comparison."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.episodes import assert_episodes_equal as episodes_equal

from rlgate.episodes import InfiniteLookbackBuffer

NESTED_OBS_SPACE = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        "inner": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 4])]),
    }
)


@pytest.fixture(params=["list", "numpy"])
def mode(request: pytest.FixtureRequest) -> str:
    """Run a test once on list-mode and once on numpy-mode (finalized) data."""
    return request.param


@pytest.fixture
def in_mode(mode: str) -> Callable[[Any], Any]:
    """Put a buffer or episode into the test's storage mode."""

    def convert(obj: Any) -> Any:
        if mode == "numpy":
            if isinstance(obj, InfiniteLookbackBuffer):
                obj.finalize()
            else:
                obj.to_numpy()
        return obj

    return convert


@pytest.fixture
def nested_obs_space() -> gym.spaces.Dict:
    return NESTED_OBS_SPACE


@pytest.fixture
def assert_episodes_equal() -> Callable[..., None]:
    """Compare two episodes column by column (lookback included), ignoring the storage mode."""
    return episodes_equal
