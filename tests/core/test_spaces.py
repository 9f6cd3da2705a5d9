"""core.spaces: one-hot encoding of Discrete and MultiDiscrete values."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlgate.core.spaces import one_hot, space_struct


def test_one_hot_of_a_large_discrete_allocates_only_its_rows() -> None:
    """Rows of a depth-n one-hot, not the n x n identity (4 TB for a million values; 3.6 GB for 30,000)."""
    space = gym.spaces.Dict({"d": gym.spaces.Discrete(10**6, start=1), "m": gym.spaces.MultiDiscrete([3, 10**6])})
    out = one_hot({"d": np.array([1, 10**6]), "m": np.array([[2, 0], [0, 999_999]])}, space_struct(space))
    assert out["d"].shape == (2, 10**6) and out["d"].dtype == np.float32
    assert out["d"].sum() == 2 and out["d"][0, 0] == 1 and out["d"][1, -1] == 1
    assert out["m"].shape == (2, 3 + 10**6)
    assert np.flatnonzero(out["m"][0]).tolist() == [2, 3] and np.flatnonzero(out["m"][1]).tolist() == [0, 3 + 999_999]
