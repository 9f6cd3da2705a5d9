"""Learner pieces and pipeline: train batches, zero padding for stateful modules, and GAE."""

import numpy as np
import pytest
import torch

from rlgate.connectors import Columns
from rlgate.connectors.builders import build_learner_pipeline
from rlgate.connectors.learner import (
    AddNextObservationsFromEpisodesToTrainBatch,
    AddOneTsToEpisodesAndTruncate,
    compute_value_targets,
    remove_last_ts_from_episodes_and_restore_truncateds,
)
from rlgate.connectors.zero_padding import create_mask_and_seq_lens, pad, split_and_zero_pad, unpad

GAMMA, LAMBDA = 0.9, 0.8


def lstm_extra(t):
    state_out = {"h": np.full(4, t + 1.0, np.float32), "c": np.full(4, -t - 1.0, np.float32)}
    return {Columns.ACTION_LOGP: np.float32(-t), Columns.STATE_OUT: state_out}


def test_learner_pipeline_builds_a_flat_train_batch(make_episode, module, obs_space, act_space):
    episodes = [make_episode(0, steps=5, size=5), make_episode(1, steps=2)]  # terminated; unfinished
    batch = build_learner_pipeline(obs_space, act_space)(rl_module=module, batch={}, episodes=episodes)
    assert set(batch) == {
        Columns.OBS, Columns.ACTIONS, Columns.REWARDS, Columns.TERMINATEDS, Columns.TRUNCATEDS,
        Columns.ACTION_LOGP, Columns.VF_PREDS,
    }  # fmt: skip
    assert all(isinstance(value, torch.Tensor) for value in batch.values())
    assert batch[Columns.OBS][:, 1].tolist() == [0, 1, 2, 3, 4, 0, 1]  # the final observations left out
    assert batch[Columns.ACTIONS].tolist() == [0, 1, 0, 1, 0, 0, 1]
    assert batch[Columns.REWARDS].tolist() == [1, 2.5, 3, 4.5, 5, 1, 2.5]
    assert batch[Columns.TERMINATEDS].tolist() == [False] * 4 + [True, False, False]
    assert not batch[Columns.TRUNCATEDS].any()
    assert batch[Columns.REWARDS].dtype == torch.float32


def test_add_one_ts_then_remove_restores_the_episodes(make_episode):
    episodes = [make_episode(0, steps=3, size=3), make_episode(1, steps=2)]  # terminated; unfinished
    before = [(len(e), e.get_observations().copy(), e.get_rewards(), e.is_truncated) for e in episodes]
    shared_data = {}
    batch = AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=episodes, shared_data=shared_data)
    assert [len(e) for e in episodes] == [4, 3]
    assert episodes[1].is_truncated and not episodes[0].is_truncated
    np.testing.assert_array_equal(episodes[0].get_observations(-1), episodes[0].get_observations(-2))
    assert episodes[0].get_rewards(-1) == 0.0
    assert batch[Columns.LOSS_MASK][(episodes[0].id_,)][0].tolist() == [True, True, True, False]
    assert batch[Columns.TERMINATEDS][(episodes[0].id_,)][0].tolist() == [False, False, True, False]
    assert batch[Columns.TRUNCATEDS][(episodes[1].id_,)][0].tolist() == [False, True, False]
    remove_last_ts_from_episodes_and_restore_truncateds(episodes, shared_data["orig_truncateds"])
    after = [(len(e), e.get_observations(), e.get_rewards(), e.is_truncated) for e in episodes]
    for (n0, obs0, rew0, tr0), (n1, obs1, rew1, tr1) in zip(before, after, strict=True):
        assert (n0, rew0, tr0) == (n1, rew1, tr1)
        np.testing.assert_array_equal(obs0, obs1)
    episodes[1].validate()


def gae_reference(episodes):
    """Hand GAE per episode: V(obs [id, t]) = id + t / 10, bootstrapped by values_bootstrapped."""
    targets = []
    for episode in episodes:
        n, env_id = len(episode), episode.get_observations(0)[0]
        values = [env_id + t / 10 for t in range(n)]
        values_bootstrapped = 0.0 if episode.is_terminated else env_id + n / 10
        rewards = episode.get_rewards()
        next_values = [*values[1:], values_bootstrapped]
        deltas = [rewards[t] + GAMMA * next_values[t] - values[t] for t in range(n)]
        advantages = [sum((GAMMA * LAMBDA) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]
        targets += [a + v for a, v in zip(advantages, values, strict=True)]
    return np.array(targets)


def three_endings(make_episode):
    """A terminated, a truncated and an unfinished (cut) episode."""
    return [make_episode(1, 3, size=3), make_episode(2, 3, size=3, truncate=True), make_episode(3, 2, size=5)]


def test_gae_matches_a_hand_computed_reference(make_episode, value_module, obs_space, act_space):
    episodes = three_endings(make_episode)
    reference = gae_reference(episodes)
    pipeline = build_learner_pipeline(obs_space, act_space, gae=(GAMMA, LAMBDA))
    batch = pipeline(rl_module=value_module, batch={}, episodes=episodes, shared_data={})
    valid = batch[Columns.LOSS_MASK].numpy()
    assert valid.tolist() == [True] * 3 + [False] + [True] * 3 + [False] + [True] * 2 + [False]
    np.testing.assert_allclose(batch[Columns.VALUE_TARGETS].numpy()[valid], reference, rtol=1e-5)
    values = batch[Columns.OBS][:, 0] + batch[Columns.OBS][:, 1] / 10
    advantages = reference - values.numpy()[valid]
    expected = (advantages - advantages.mean()) / advantages.std()
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy()[valid], expected, rtol=1e-4, atol=1e-5)
    assert batch[Columns.ADVANTAGES].dtype == torch.float32


def test_terminated_and_truncated_endings_bootstrap_differently(make_episode, value_module, obs_space, act_space):
    terminated, truncated = make_episode(1, 3, size=3), make_episode(1, 3, size=3, truncate=True)
    pipeline = build_learner_pipeline(obs_space, act_space, gae=(GAMMA, LAMBDA))
    batch = pipeline(rl_module=value_module, batch={}, episodes=[terminated, truncated])
    targets = batch[Columns.VALUE_TARGETS].numpy()
    # Same rewards and values; only the last step differs, by gamma * V(final obs [1, 3]) = 0.9 * 1.3.
    assert targets[2] == pytest.approx(3.0)  # the last reward alone
    assert targets[6] == pytest.approx(3.0 + GAMMA * 1.3)


def test_compute_value_targets_stops_at_episode_ends():
    values = np.array([1.0, 2.0, 10.0, 3.0])
    rewards = np.array([1.0, 1.0, 0.0, 1.0])
    terminateds = np.array([False, True, False, False])
    truncateds = np.zeros(4, bool)
    targets = compute_value_targets(values, rewards, terminateds, truncateds, gamma=0.5, lambda_=1.0)
    # Step 1 is terminal: target 1; step 0: 1 + 0.5 * 1 = 1.5 (step 2's value of 10 is never used).
    np.testing.assert_allclose(targets[:2], [1.5, 1.0])


def test_zero_padding_helpers_round_trip():
    mask, seq_lens = create_mask_and_seq_lens(5, 2)
    assert seq_lens.tolist() == [2, 2, 1] and mask.tolist() == [[1, 1], [1, 1], [1, 0]]
    padded = split_and_zero_pad({"x": np.arange(5)}, 2)["x"]
    assert padded.tolist() == [[0, 1], [2, 3], [4, 0]]
    steps = np.arange(7.0)
    np.testing.assert_array_equal(unpad(pad(steps, [5, 2], 3), [5, 2]), steps)
    assert pad(steps, [5, 2], 3).shape == (3, 3)


def test_stateful_learner_batch_is_zero_padded_with_seq_lens_and_state_in(
    make_episode, lstm_module, obs_space, act_space
):
    long, short = make_episode(1, 4, extra=lstm_extra), make_episode(2, 2, extra=lstm_extra)
    successor = make_episode(3, 4, extra=lstm_extra).cut(len_lookback_buffer=1)  # t_started 4, empty
    for t in range(2):
        successor.add_env_step(np.array([3, 5 + t], np.float32), 0, 1.0, extra_model_outputs=lstm_extra(4 + t))
    batch = build_learner_pipeline(obs_space, act_space)(
        rl_module=lstm_module, batch={}, episodes=[long, short, successor]
    )
    assert batch[Columns.OBS].shape == (4, 3, 2)  # max_seq_len 3: 2 + 1 + 1 sequences
    assert batch[Columns.SEQ_LENS].tolist() == [3, 1, 2, 2]
    assert batch[Columns.LOSS_MASK].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert batch[Columns.OBS][1].tolist() == [[1, 3], [0, 0], [0, 0]]
    assert batch[Columns.ACTION_LOGP].shape == (4, 3)
    # State before each sequence: initial (zeros) at t=0, else the previous step's STATE_OUT (t + 1).
    assert batch[Columns.STATE_IN]["h"][:, 0].tolist() == [0.0, 3.0, 0.0, 4.0]
    assert Columns.STATE_OUT not in batch
    out = lstm_module.forward_train(batch)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (4, 3, 2)


def test_gae_on_zero_padded_batches_equals_the_flat_one(make_episode, stateful_value_module, obs_space, act_space):
    episodes = three_endings(make_episode)
    reference = gae_reference(episodes)
    pipeline = build_learner_pipeline(obs_space, act_space, gae=(GAMMA, LAMBDA))
    batch = pipeline(rl_module=stateful_value_module, batch={}, episodes=episodes)
    assert batch[Columns.VALUE_TARGETS].shape == (5, 3)  # episodes of 4, 4, 3 steps (one added each)
    valid = batch[Columns.LOSS_MASK].numpy()
    np.testing.assert_allclose(batch[Columns.VALUE_TARGETS].numpy()[valid], reference, rtol=1e-5)
    padding = ~create_mask_and_seq_lens(4, 3)[0]
    assert batch[Columns.ADVANTAGES].numpy()[:2][padding].tolist() == [0.0, 0.0]


def test_normalize_rewards_divides_by_the_spread_of_discounted_returns_as_sb3_does():
    """SB3's VecNormalize keeps RunningMeanStd of ret = ret * gamma + r and returns r / sqrt(var + eps)."""
    from rlgate.connectors.learner import NormalizeRewards
    from rlgate.episodes import SingleAgentEpisode

    rewards = [np.array([1.0, 0.0, 2.0, 5.0]), np.array([3.0, -1.0])]
    episodes = []
    for chunk in rewards:
        episode = SingleAgentEpisode()
        episode.add_env_reset(np.zeros(1))
        for reward in chunk:
            episode.add_env_step(np.zeros(1), 0, reward)
        episodes.append(episode.to_numpy())
    piece = NormalizeRewards(gamma=0.5, clip=2.0)
    piece(rl_module=None, batch={}, episodes=episodes)
    returns = np.concatenate([[1.0, 0.5, 2.25, 6.125], [3.0, 0.5]])  # per chunk, from 0
    scale = np.sqrt(returns.var(ddof=1) + 1e-8)
    expected = np.clip(np.concatenate(rewards) / scale, -2.0, 2.0)
    actual = np.concatenate([np.asarray(e.get_rewards()) for e in episodes])
    np.testing.assert_allclose(actual, expected, rtol=1e-6)
    assert piece.get_state()["returns"]["count"] == 6


def test_vtrace_targets_are_gae_targets_on_policy_and_cut_by_truncated_ratios_off_policy():
    """With pi == mu (log_rhos 0), V-trace with traces lambda * min(1, ratio) is GAE(lambda); a step whose action
    the current policy would rarely take (ratio << 1) pulls the targets of the steps before it towards V."""
    from rlgate.connectors.learner import compute_vtrace_targets

    rng = np.random.default_rng(0)
    values, rewards = rng.standard_normal(9), rng.standard_normal(9)
    terminateds = np.zeros(9, bool)
    terminateds[4] = True
    truncateds = np.zeros(9, bool)
    truncateds[8] = True
    gae = compute_value_targets(values, rewards, terminateds, truncateds, 0.9, 0.8)
    on_policy = compute_vtrace_targets(values, rewards, terminateds, truncateds, np.zeros(9), 0.9, 0.8)
    np.testing.assert_allclose(on_policy, gae, rtol=1e-5, atol=1e-6)
    log_rhos = np.zeros(9)
    log_rhos[2] = np.log(1e-6)  # the current policy all but never takes step 2's action
    off = compute_vtrace_targets(values, rewards, terminateds, truncateds, log_rhos, 0.9, 0.8)
    assert off[2] == pytest.approx(values[2], abs=1e-4)  # no correction from a step it would not take
    np.testing.assert_allclose(off[5:], gae[5:], rtol=1e-5)  # the next episode is untouched
    assert not np.allclose(off[:2], gae[:2])  # the trace is cut at step 2 for the steps before it


def test_next_observations_are_each_steps_following_observation(make_episode, module, obs_space, act_space):
    """RLlib's doctest of AddNextObservationsFromEpisodesToTrainBatch: all but each episode's first observation."""
    episodes = [make_episode(0, steps=5, size=5), make_episode(1, steps=2)]  # terminated; unfinished
    pieces = AddNextObservationsFromEpisodesToTrainBatch()(rl_module=None, batch={}, episodes=episodes)
    for episode in episodes:
        items = pieces[Columns.NEXT_OBS][(episode.id_,)]  # list-mode episodes: one item per step
        np.testing.assert_array_equal(items, episode.get_observations(slice(1, len(episode) + 1)))
    batch = build_learner_pipeline(obs_space, act_space, next_observations=True)(
        rl_module=module, batch={}, episodes=episodes
    )
    assert batch[Columns.NEXT_OBS][:, 1].tolist() == [1, 2, 3, 4, 5, 1, 2]
    assert batch[Columns.OBS][:, 1].tolist() == [0, 1, 2, 3, 4, 0, 1]
    given = {Columns.NEXT_OBS: np.zeros((7, 2), np.float32)}  # a batch that has them (the replay fast path)
    assert AddNextObservationsFromEpisodesToTrainBatch()(rl_module=None, batch=given, episodes=episodes) is given
    assert not given[Columns.NEXT_OBS].any()
