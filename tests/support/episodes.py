"""Episodes compared column by column, lookback included, whatever their storage mode (list or numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlgate.core.tree import batch
from rlgate.episodes import InfiniteLookbackBuffer, SingleAgentEpisode


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


def assert_episodes_equal(a: SingleAgentEpisode, b: SingleAgentEpisode, *, infos: bool = True) -> None:
    """Compare two episodes column by column (lookback included), ignoring the storage mode."""
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
