"""Shared fixtures for the episodes tests: both storage modes, nested spaces, episode comparison."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlgate.core.tree import batch
from rlgate.episodes import InfiniteLookbackBuffer, SingleAgentEpisode

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


def column(buffer: InfiniteLookbackBuffer) -> Any:
    """All of a buffer's data (lookback included) as a nested struct of arrays, whatever its mode."""
    if buffer.finalized:
        return buffer.data
    return batch(buffer.data) if buffer.data else None


def assert_columns_equal(a: InfiniteLookbackBuffer, b: InfiniteLookbackBuffer) -> None:
    assert a.lookback == b.lookback
    assert a.len_incl_lookback() == b.len_incl_lookback()
    if a.len_incl_lookback() == 0:
        return
    assert_same_arrays(column(a), column(b))


def assert_same_arrays(x: Any, y: Any) -> None:
    """Equal values and dtypes, leaf by leaf; dict leaves are matched by key (the wire keeps no order)."""
    assert type(x) is type(y)
    if isinstance(x, dict):
        assert set(x) == set(y)
        for key in x:
            assert_same_arrays(x[key], y[key])
    elif isinstance(x, tuple):
        assert len(x) == len(y)
        for a, b in zip(x, y, strict=True):
            assert_same_arrays(a, b)
    else:
        np.testing.assert_array_equal(x, y)
        assert x.dtype == y.dtype


@pytest.fixture
def assert_episodes_equal() -> Callable[[SingleAgentEpisode, SingleAgentEpisode], None]:
    """Compare two episodes column by column (lookback included), ignoring the storage mode."""

    def check(a: SingleAgentEpisode, b: SingleAgentEpisode, *, infos: bool = True) -> None:
        assert (a.id_, a.t_started, a.t, len(a)) == (b.id_, b.t_started, b.t, len(b))
        assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)
        assert a.chunk_index == b.chunk_index
        for name in ("observations", "actions", "rewards"):
            assert_columns_equal(getattr(a, name), getattr(b, name))
        assert set(a.extra_model_outputs) == set(b.extra_model_outputs)
        for key in a.extra_model_outputs:
            assert_columns_equal(a.extra_model_outputs[key], b.extra_model_outputs[key])
        if infos:
            assert a.infos.data == b.infos.data
            assert a.infos.lookback == b.infos.lookback

    return check
