"""MeanStdFilter state: exact merging across servers and sync rounds (RLlib 2.60 drifts after the first)."""

import gymnasium as gym
import numpy as np
import pytest

from rlgate.connectors import Columns
from rlgate.connectors.env_to_module import MeanStdFilter
from rlgate.core import codec
from rlgate.episodes import SingleAgentEpisode

SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def serve(server: MeanStdFilter, obs: np.ndarray) -> np.ndarray:
    """One fast-path call of `server` on a batch of fresh episodes; returns the filtered batch."""
    episodes = [SingleAgentEpisode(observations=[row], observation_space=SPACE) for row in obs]
    return server(rl_module=None, batch={Columns.OBS: obs}, episodes=episodes)[Columns.OBS]


def test_three_servers_three_sync_rounds_match_numpy_over_all_data():
    rng = np.random.default_rng(0)
    servers = [MeanStdFilter(SPACE) for _ in range(3)]
    coordinator = MeanStdFilter(SPACE)
    seen = []
    for sync_round in range(3):
        for i, server in enumerate(servers):
            for _ in range(2):  # different batch sizes and distributions per server and round
                obs = rng.normal(10.0 * i + sync_round, 1.0 + i, size=(4 + i + sync_round, 2)).astype(np.float32)
                serve(server, obs)
                seen.append(obs)
        merged = coordinator.merge_states([server.get_state() for server in servers])
        for piece in (coordinator, *servers):
            piece.set_state(merged)
        everything = np.concatenate(seen).astype(np.float64)
        stats = merged["global"][0]
        assert stats["count"] == len(everything)
        np.testing.assert_allclose(stats["mean"], everything.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(stats["m2"] / (stats["count"] - 1), everything.var(axis=0, ddof=1), rtol=1e-10)
        assert merged["delta"][0]["count"] == 0
    # After the sync every server filters with the merged statistics (plus what it sees next).
    new = np.array([[5.0, 5.0]], np.float32)
    expected = np.concatenate([everything, new]).astype(np.float64)
    filtered = serve(servers[2], new)
    np.testing.assert_allclose(filtered[0], (new[0] - expected.mean(0)) / expected.std(0, ddof=1), rtol=1e-5)


def test_state_round_trip_and_a_server_joining_late():
    early, late = MeanStdFilter(SPACE), MeanStdFilter(SPACE)
    serve(early, np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    coordinator = MeanStdFilter(SPACE)
    merged = coordinator.merge_states([early.get_state()])
    coordinator.set_state(merged)
    early.set_state(merged)
    serve(late, np.array([[5.0, 6.0]], np.float32))  # never synced: its global is empty, only its delta counts
    merged = coordinator.merge_states([early.get_state(), late.get_state()])
    assert merged["global"][0]["count"] == 3
    np.testing.assert_allclose(merged["global"][0]["mean"], [3.0, 4.0])
    restored = MeanStdFilter(SPACE)
    restored.set_state(late.get_state())
    for part in ("global", "delta"):
        ours, theirs = restored.get_state()[part][0], late.get_state()[part][0]
        assert ours["count"] == theirs["count"]
        np.testing.assert_array_equal(ours["mean"], theirs["mean"])
        np.testing.assert_array_equal(ours["m2"], theirs["m2"])


def server_state() -> dict:
    """A server's state as the learner decodes it from the wire (counts 0-d int64 arrays, lists tuples)."""
    server = MeanStdFilter(SPACE)
    serve(server, np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    return codec.from_value(codec.to_value(server.get_state()))


def with_delta(**stats) -> dict:
    """The server's state with `stats` over its delta's count, mean or m2."""
    state = server_state()
    return {**state, "delta": ({**state["delta"][0], **stats},)}


# What a broken or hostile server could send: each would poison the merged statistics or fail merging.
UNFIT = {
    "NaN mean": (with_delta(mean=np.array([np.nan, 0.0])), r"delta\[0\]: mean is not finite"),
    "infinite m2": (with_delta(m2=np.array([np.inf, 0.0])), r"delta\[0\]: m2 is not finite"),
    "negative m2": (with_delta(m2=np.array([-1.0, 0.0])), r"delta\[0\]: m2 is negative"),
    "negative count": (with_delta(count=np.array(-100)), r"delta\[0\]: count must be an integer in \[0, 2\*\*63\)"),
    "count of shape [1]": (with_delta(count=np.array([2])), r"delta\[0\]: count .* of shape \(1,\)"),
    "float count": (with_delta(count=np.array(2.0)), r"delta\[0\]: count .* not float64"),
    "mean of shape [3]": (with_delta(mean=np.zeros(3)), r"delta\[0\]: mean must be float64 of shape \(2,\)"),
    "float32 m2": (with_delta(m2=np.zeros(2, np.float32)), r"delta\[0\]: m2 must be float64"),
    "no m2": ({**server_state(), "delta": ({"count": np.array(2), "mean": np.zeros(2)},)}, r"count, mean and m2"),
    "two Box parts": ({**server_state(), "global": server_state()["global"] * 2}, r"global must hold .* 1 Box parts"),
    "no global": ({"delta": server_state()["delta"]}, r"global and delta, not keys \['delta'\]"),
    "a tensor": (np.zeros(2), r"global and delta, not ndarray"),
}


def test_a_servers_state_from_the_wire_fits():
    MeanStdFilter(SPACE).check_state(server_state())


@pytest.mark.parametrize("state, message", UNFIT.values(), ids=UNFIT)
def test_a_state_that_does_not_fit_is_refused_before_merging(state, message):
    coordinator = MeanStdFilter(SPACE)
    with pytest.raises(ValueError, match=message):
        coordinator.check_state(state)
