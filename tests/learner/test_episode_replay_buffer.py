"""EpisodeReplayBuffer and PrioritizedEpisodeReplayBuffer: chunks joined, capacity in env steps with the oldest
episodes evicted, n-step transitions checked against the episodes they came from, priorities and weights."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.episode_replay_buffer import N_STEP, WEIGHTS, EpisodeReplayBuffer
from rlgate.learner.prioritized_episode_replay_buffer import PrioritizedEpisodeReplayBuffer

GAMMA = 0.9


def episode(number: int, length: int, *, terminated: bool = False, truncated: bool = False) -> SingleAgentEpisode:
    """Episode `number`: observation [number, t] at step t, action t % 2, reward number + t / 100."""
    return SingleAgentEpisode(
        f"e{number}",
        observations=[np.array([number, t], np.float32) for t in range(length + 1)],
        actions=[t % 2 for t in range(length)],
        rewards=[number + t / 100 for t in range(length)],
        extra_model_outputs={Columns.MODEL_VERSION: [np.int64(t) for t in range(length)]},
        terminated=terminated,
        truncated=truncated,
        len_lookback_buffer=0,
    ).to_numpy()


def chunks(whole: SingleAgentEpisode, *cuts: int) -> list[SingleAgentEpisode]:
    """The episode cut at these steps into chunks as servers ship them (one step of lookback each)."""
    bounds = [0, *cuts, len(whole)]
    return [whole.slice(slice(a, b), len_lookback_buffer=1) for a, b in pairwise(bounds)]


def expected(whole: SingleAgentEpisode, t: int, n: int, known: int | None = None) -> dict:
    """The n-step transition from step t of `whole`, whose data reaches step `known` (default: all of it)."""
    end = len(whole) if known is None else known
    span = min(n, end - t)
    reaches_end = t + span == len(whole)
    return {
        "obs": whole.get_observations(t),
        "next_obs": whole.get_observations(t + span),
        "action": whole.get_actions(t),
        "reward": sum(GAMMA**k * whole.get_rewards(t + k) for k in range(span)),
        "terminated": reaches_end and whole.is_terminated,
        "truncated": reaches_end and whole.is_truncated,
        "n_step": span,
    }


def check(transition: SingleAgentEpisode, wholes: dict[str, SingleAgentEpisode], n: int, known: dict | None = None):
    """The one-step episode `sample` returned is the n-step transition of its episode at its t_started."""
    whole = wholes[transition.id_]
    want = expected(whole, transition.t_started, n, (known or {}).get(transition.id_))
    got_n = int(transition.get_extra_model_outputs(N_STEP, 0))
    assert got_n == want["n_step"]
    np.testing.assert_array_equal(transition.get_observations(0), want["obs"])
    np.testing.assert_array_equal(transition.get_observations(1), want["next_obs"])
    assert transition.get_actions(0) == want["action"]
    assert transition.get_rewards(0) == pytest.approx(want["reward"], rel=1e-6)
    assert (transition.is_terminated, transition.is_truncated) == (want["terminated"], want["truncated"])
    assert len(transition) == 1


def test_chunks_of_an_episode_are_joined_and_n_step_crosses_the_cut() -> None:
    whole = episode(1, 10, terminated=True)
    buffer = EpisodeReplayBuffer(100, seed=0)
    buffer.add(chunks(whole, 4, 7))

    assert (buffer.get_num_episodes(), len(buffer), buffer.get_added_timesteps()) == (1, 10, 10)
    sampled = buffer.sample(400, n_step=3, gamma=GAMMA)
    for transition in sampled:
        check(transition, {"e1": whole}, 3)
    starts = {t.t_started for t in sampled}
    assert starts == set(range(10))  # every step drawn, those at the cuts (3, 6) too
    assert any(t.is_terminated for t in sampled) and not any(t.is_truncated for t in sampled)


def test_n_step_stops_where_the_data_ends_and_continues_once_the_next_chunk_comes() -> None:
    whole = episode(2, 9, truncated=True)
    first, second = chunks(whole, 5)
    buffer = EpisodeReplayBuffer(100, seed=1)
    buffer.add(first)
    for transition in buffer.sample(200, n_step=3, gamma=GAMMA):
        check(transition, {"e2": whole}, 3, known={"e2": 5})
        assert not (transition.is_terminated or transition.is_truncated)

    buffer.add(second)
    sampled = buffer.sample(300, n_step=3, gamma=GAMMA)
    for transition in sampled:
        check(transition, {"e2": whole}, 3)
    assert {t.t_started for t in sampled if t.is_truncated} == {6, 7, 8}  # a truncated end: truncated, not terminated
    assert not any(t.is_terminated for t in sampled)


def test_a_range_of_n_draws_each_n_in_the_closed_interval() -> None:
    whole = episode(3, 200, terminated=True)
    buffer = EpisodeReplayBuffer(1000, seed=2)
    buffer.add(whole)
    sampled = buffer.sample(600, n_step=(2, 4), gamma=GAMMA)
    spans = Counter(int(t.get_extra_model_outputs(N_STEP, 0)) for t in sampled if t.t_started < 190)
    assert set(spans) == {2, 3, 4}
    for transition in sampled:
        n = int(transition.get_extra_model_outputs(N_STEP, 0))
        check(transition, {"e3": whole}, max(n, 2) if transition.t_started >= 196 else n)


def test_capacity_counts_env_steps_and_the_oldest_episodes_go_whole() -> None:
    buffer = EpisodeReplayBuffer(10, seed=3)
    wholes = {f"e{i}": episode(i, 6, terminated=True) for i in range(4)}
    buffer.add(wholes["e0"])
    buffer.add(wholes["e1"])  # 12 > 10: e0 goes
    assert list(buffer.episodes) == ["e1"] and len(buffer) == 6
    assert buffer.get_num_episodes_evicted() == 1
    long = episode(9, 25, terminated=True)
    buffer.add(long)  # longer than the capacity alone: kept, the older ones go
    assert list(buffer.episodes) == ["e9"] and len(buffer) == 25
    buffer.add([wholes["e2"], wholes["e3"]])  # e9 goes for e2, e2 for e3 (12 steps > 10): e0, e1, e9, e2 gone
    assert list(buffer.episodes) == ["e3"] and len(buffer) == 6 and buffer.get_num_episodes_evicted() == 4
    for transition in buffer.sample(300, n_step=2, gamma=GAMMA):  # rows of evicted episodes, reused, hold no trace
        check(transition, {**wholes, "e9": long}, 2)
    assert {t.id_ for t in buffer.sample(100)} == {"e3"}


def test_many_interleaved_chunks_through_a_small_buffer_stay_consistent() -> None:
    rng = np.random.default_rng(0)
    buffer = EpisodeReplayBuffer(60, seed=4)
    wholes, running = {}, {}
    for number in range(40):  # four envs at a time, chunks of up to 7 steps, episodes 3-20 steps long
        whole = episode(number, int(rng.integers(3, 21)), terminated=bool(number % 3))
        wholes[whole.id_] = whole
        bounds = sorted(set(rng.integers(1, len(whole), 3).tolist()))
        running[whole.id_] = chunks(whole, *bounds)
        while len(running) >= 4 or (number == 39 and running):
            episode_id = next(iter(running)) if rng.random() < 0.5 else list(running)[-1]
            buffer.add(running[episode_id].pop(0))
            if not running[episode_id]:
                del running[episode_id]
        assert len(buffer) <= 60 or buffer.get_num_episodes() == 1
    for transition in buffer.sample(500, n_step=(1, 3), gamma=GAMMA):
        n = int(transition.get_extra_model_outputs(N_STEP, 0))
        check(transition, wholes, n)


def test_a_lost_chunk_leaves_a_gap_no_transition_crosses() -> None:
    whole = episode(5, 12, terminated=True)
    first, _lost, third = chunks(whole, 4, 8)
    buffer = EpisodeReplayBuffer(100, seed=5)
    buffer.add([first, third])
    assert buffer.get_num_episodes() == 1 and len(buffer) == 8
    for transition in buffer.sample(300, n_step=3, gamma=GAMMA):
        check(transition, {"e5": whole}, 3, known={"e5": 4} if transition.t_started < 4 else None)


def test_sample_transitions_are_the_columns_of_the_sampled_episodes() -> None:
    whole = episode(6, 30, terminated=True)
    one, two = (EpisodeReplayBuffer(100, seed=6) for _ in range(2))
    for buffer in (one, two):
        buffer.add(chunks(whole, 11, 20))
    columns = one.sample_transitions(64, n_step=3, gamma=GAMMA, include_extra_model_outputs=True)
    sampled = two.sample(64, n_step=3, gamma=GAMMA, include_extra_model_outputs=True)
    np.testing.assert_array_equal(columns[Columns.OBS], [t.get_observations(0) for t in sampled])
    np.testing.assert_array_equal(columns[Columns.NEXT_OBS], [t.get_observations(1) for t in sampled])
    np.testing.assert_array_equal(columns[Columns.ACTIONS], [t.get_actions(0) for t in sampled])
    np.testing.assert_allclose(columns[Columns.REWARDS], [t.get_rewards(0) for t in sampled], rtol=1e-6)
    np.testing.assert_array_equal(columns[Columns.TERMINATEDS], [t.is_terminated for t in sampled])
    np.testing.assert_array_equal(columns[N_STEP], [t.get_extra_model_outputs(N_STEP, 0) for t in sampled])
    versions = [t.get_extra_model_outputs(Columns.MODEL_VERSION, 0) for t in sampled]
    np.testing.assert_array_equal(columns[Columns.MODEL_VERSION], versions)
    np.testing.assert_array_equal(versions, [t.t_started for t in sampled])  # the first step's outputs
    np.testing.assert_array_equal(columns[WEIGHTS], np.ones(64))


def test_state_round_trip_samples_the_same_and_a_smaller_buffer_keeps_the_newest() -> None:
    wholes = {f"e{i}": episode(i, 8, terminated=i < 3) for i in range(5)}
    buffer = EpisodeReplayBuffer(100, seed=7)
    for whole in wholes.values():
        buffer.add(chunks(whole, 3))
    arrays, meta = buffer.get_state()
    restored = EpisodeReplayBuffer(100, seed=7)
    restored.set_state(arrays, meta)
    assert (len(restored), list(restored.episodes), restored.get_added_timesteps()) == (40, list(wholes), 40)
    buffer.rng, restored.rng = np.random.default_rng(1), np.random.default_rng(1)
    a = buffer.sample_transitions(50, n_step=3, gamma=GAMMA)
    b = restored.sample_transitions(50, n_step=3, gamma=GAMMA)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    smaller = EpisodeReplayBuffer(20, seed=8)
    smaller.set_state(arrays, meta)
    assert list(smaller.episodes) == ["e3", "e4"]
    for transition in smaller.sample(100, n_step=3, gamma=GAMMA):
        check(transition, wholes, 3)


def test_a_chunk_without_a_column_the_buffer_holds_is_refused_whole() -> None:
    buffer = EpisodeReplayBuffer(100)
    buffer.add(episode(1, 5))
    observations = [np.zeros(2, np.float32)] * 3
    bare = SingleAgentEpisode("e2", observations=observations, actions=[0, 1], rewards=[0, 1.0], len_lookback_buffer=0)
    with pytest.raises(ValueError, match="model_version"):
        buffer.add(bare)
    assert len(buffer) == 5 and list(buffer.episodes) == ["e1"]
    with pytest.raises(ValueError, match="empty"):
        EpisodeReplayBuffer(10).sample(4)


def test_prioritized_sampling_follows_the_td_errors_and_weights_correct_for_it() -> None:
    whole = episode(7, 100, terminated=True)
    buffer = PrioritizedEpisodeReplayBuffer(1000, alpha=1.0, seed=9)
    buffer.add(whole)
    first = buffer.sample(100, beta=0.4)
    assert all(float(t.get_extra_model_outputs(WEIGHTS, 0)) == pytest.approx(1.0) for t in first)  # all at max
    # The last batch's steps get their TD errors as priorities: step 10's tenfold any other's.
    errors = np.array([10.0 if t.t_started == 10 else 0.1 for t in first])
    if not (errors == 10.0).any():
        errors[0] = 10.0
    buffer.update_priorities(errors)
    favoured = {t.t_started for t, e in zip(first, errors, strict=True) if e == 10.0}
    drawn = Counter(t.t_started for t in buffer.sample(4000, beta=0.4))
    unsampled = set(range(100)) - {t.t_started for t in first}  # still at the first max priority, 1.0
    share = sum(drawn[t] for t in favoured) / 4000
    total = 10.0 * len(favoured) + 1.0 * len(unsampled) + 0.1 * (100 - len(favoured) - len(unsampled))
    assert share == pytest.approx(10.0 * len(favoured) / total, abs=0.05)
    columns = buffer.sample_transitions(500, beta=0.4)
    t = columns[Columns.OBS][:, 1].astype(int)
    priorities = np.where(np.isin(t, list(favoured)), 10.0, np.where(np.isin(t, list(unsampled)), 1.0, 0.1))
    want = (priorities / total * 100) ** -0.4 / (0.1 / total * 100) ** -0.4  # the rarest step's weight is 1
    np.testing.assert_allclose(columns[WEIGHTS], want, rtol=1e-5)


def test_prioritized_with_alpha_zero_is_uniform_and_new_steps_get_the_highest_priority() -> None:
    buffer = PrioritizedEpisodeReplayBuffer(1000, alpha=0.0, seed=10)
    buffer.add(episode(8, 50, terminated=True))
    buffer.sample(50)
    buffer.update_priorities(np.linspace(0.0, 5.0, 50))
    columns = buffer.sample_transitions(300, beta=1.0)
    np.testing.assert_allclose(columns[WEIGHTS], 1.0)
    spread = PrioritizedEpisodeReplayBuffer(1000, alpha=1.0, seed=11)
    spread.add(episode(8, 50, terminated=True))
    lowered = len({t.t_started for t in spread.sample(50)})
    spread.update_priorities(np.full(50, 0.5))
    spread.add(episode(9, 50, terminated=True))  # enters at the highest priority seen (1.0, the start's)
    ids = Counter(t.id_ for t in spread.sample(3000))
    assert ids["e9"] / 3000 == pytest.approx(50 / (50 + (50 - lowered) + 0.5 * lowered), abs=0.04)
    with pytest.raises(ValueError, match="priorities"):
        spread.update_priorities(np.ones(3))


def test_prioritized_state_keeps_the_priorities() -> None:
    buffer = PrioritizedEpisodeReplayBuffer(1000, alpha=1.0, seed=12)
    buffer.add(episode(1, 20, terminated=True))
    buffer.sample(20)
    buffer.update_priorities(np.arange(1.0, 21.0))
    arrays, meta = buffer.get_state()
    restored = PrioritizedEpisodeReplayBuffer(1000, alpha=1.0, seed=12)
    restored.set_state(arrays, meta)
    buffer.rng, restored.rng = np.random.default_rng(3), np.random.default_rng(3)
    a, b = buffer.sample_transitions(64, beta=0.5), restored.sample_transitions(64, beta=0.5)
    np.testing.assert_array_equal(a[Columns.OBS], b[Columns.OBS])
    np.testing.assert_allclose(a[WEIGHTS], b[WEIGHTS])


def test_the_learner_pipeline_over_sampled_episodes_makes_the_fast_paths_columns() -> None:
    """DQN's and SAC's learner pipeline (AddNextObservationsFromEpisodesToTrainBatch among the defaults) over the
    one-step episodes `sample` returns gives the columns `sample_transitions` makes at once."""
    whole = episode(4, 40, truncated=True)
    one, two = (EpisodeReplayBuffer(100, seed=13) for _ in range(2))
    for buffer in (one, two):
        buffer.add(chunks(whole, 13, 27))
    space = gym.spaces.Box(-1000.0, 1000.0, (2,), np.float32)
    pipeline = build_learner_pipeline(space, gym.spaces.Discrete(2), next_observations=True)
    batch = pipeline(rl_module=None, batch={}, episodes=two.sample(32, n_step=(1, 3), gamma=GAMMA))
    columns = one.sample_transitions(32, n_step=(1, 3), gamma=GAMMA)
    assert set(batch) == set(columns)
    for key, tensor in batch.items():
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_allclose(tensor.numpy(), columns[key], rtol=1e-6, err_msg=key)


def test_non_finite_td_errors_leave_the_priorities_as_they_were() -> None:
    buffer = PrioritizedEpisodeReplayBuffer(1000, alpha=1.0, seed=14)
    buffer.add(episode(2, 10, terminated=True))
    buffer.sample(10)
    buffer.update_priorities(np.full(10, np.inf))
    weights = buffer.sample_transitions(64, beta=0.4)[WEIGHTS]
    assert np.isfinite(weights).all() and np.allclose(weights, 1.0)
