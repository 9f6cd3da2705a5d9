"""Env-to-module pieces, and the batched fast path against the per-episode path."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors import Columns, ConnectorV2
from rlgate.connectors.batching import batch_items
from rlgate.connectors.builders import build_env_to_module_pipeline, build_module_to_env_pipeline
from rlgate.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    BatchIndividualItems,
    NumpyToTensor,
)
from rlgate.connectors.env_to_module import (
    FlattenObservations,
    FrameStackingEnvToModule,
    MeanStdFilter,
    ObservationPreprocessor,
    PrevActionsPrevRewards,
)
from rlgate.connectors.learner import FrameStackingLearner
from rlgate.episodes import SingleAgentEpisode
from rlgate.models import ModelConfig, build_module


class AddT(ConnectorV2):
    """A per-episode user piece (RLlib style): adds each episode's t as a column."""

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        for episode in self.single_agent_episode_iterator(episodes):
            self.add_batch_item(batch, "t", np.int64(episode.t), episode)
        return batch


def lstm_extra(t):
    return {
        Columns.ACTION_LOGP: np.float32(-0.1 * t),
        Columns.STATE_OUT: {"h": np.full(4, t + 1, np.float32), "c": np.full(4, -t - 1, np.float32)},
    }


def latest_obs_batch(episodes):
    """What the server passes: the episodes' latest observations as one array."""
    return {Columns.OBS: np.stack([e.get_observations(-1) for e in episodes])}


def run_both_paths(make_episodes, pipeline_factory, module, fast_batch=latest_obs_batch):
    """Run fresh episodes and pipelines through the fast path and the per-episode path (explore=False)."""
    results = []
    for fast in (True, False):
        episodes = make_episodes()
        env_to_module, module_to_env = pipeline_factory()
        shared_data = {}
        batch = fast_batch(episodes) if fast else {}
        to_module = env_to_module(
            rl_module=module, batch=batch, episodes=episodes, explore=False, shared_data=shared_data
        )
        with torch.no_grad():
            out = module.forward_inference(to_module)
        to_env = module_to_env(rl_module=module, batch=out, episodes=episodes, explore=False, shared_data=shared_data)
        results.append((to_module, to_env, shared_data, episodes))
    return results


def assert_same(a, b):
    assert type(a) is type(b) or isinstance(a, np.ndarray | torch.Tensor)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("stateful", [False, True])
def test_fast_path_gives_the_per_episode_path_batches(make_episode, module, lstm_module, stateful):
    rl_module = lstm_module if stateful else module
    extra = lstm_extra if stateful else None

    def make_episodes():
        return [make_episode(0, 0, extra=extra), make_episode(1, 2, extra=extra), make_episode(2, 1, extra=extra)]

    def pipelines():
        spaces = (make_episode().observation_space, make_episode().action_space)
        return (
            build_env_to_module_pipeline(*spaces, env_to_module_connector=lambda o, a: [MeanStdFilter(), AddT()]),
            build_module_to_env_pipeline(*spaces),
        )

    (fast, fast_env, fast_shared, _), (slow, slow_env, slow_shared, _) = run_both_paths(
        make_episodes, pipelines, rl_module
    )
    assert_same(fast, slow)
    assert_same(fast_env, slow_env)
    assert "memorized_map_structure" not in fast_shared and len(slow_shared["memorized_map_structure"]) == 3
    assert fast["t"].reshape(-1).tolist() == [0, 2, 1]  # stateful: [B, 1], time axis added
    if stateful:
        assert fast[Columns.OBS].shape == (3, 1, 2)
        # Fresh episode: the initial (zero) state; the others: their latest STATE_OUT.
        np.testing.assert_array_equal(fast[Columns.STATE_IN]["h"][:, 0], [0.0, 2.0, 1.0])
        assert fast_env[Columns.STATE_OUT]["h"].shape == (3, 4)
        assert fast_env[Columns.ACTION_DIST_INPUTS].shape == (3, 2)
    assert fast_env[Columns.ACTIONS].shape == (3,)
    assert fast_env[Columns.ACTIONS_FOR_ENV] is fast_env[Columns.ACTIONS]  # Discrete: nothing to unsquash


def test_add_observations_leaves_a_present_obs_alone_and_gathers_otherwise(make_episode):
    episodes = [make_episode(0, 2), make_episode(1, 3)]
    piece = AddObservationsFromEpisodesToBatch()
    present = {Columns.OBS: "batched"}
    assert piece(rl_module=None, batch=present, episodes=episodes) == {Columns.OBS: "batched"}
    batch = piece(rl_module=None, batch={}, episodes=episodes)
    np.testing.assert_array_equal(batch[Columns.OBS][(episodes[1].id_,)][0], [1, 3])


def test_add_observations_as_learner_connector_adds_all_but_the_final_observation(make_episode):
    episodes = [make_episode(0, 2), make_episode(1, 3)]
    episodes[1].id_ = episodes[0].id_  # two chunks of one episode
    batch = AddObservationsFromEpisodesToBatch(as_learner_connector=True)(rl_module=None, batch={}, episodes=episodes)
    batch = BatchIndividualItems()(rl_module=None, batch=batch, episodes=episodes, shared_data={})
    np.testing.assert_array_equal(batch[Columns.OBS][:, 1], [0, 1, 0, 1, 2])
    assert episodes[0].id_ != episodes[1].id_


def test_add_time_dim_and_states_are_no_ops_for_a_stateless_module(make_episode, module):
    episodes = [make_episode()]
    batch = {Columns.OBS: np.zeros((1, 2), np.float32)}
    for piece in (AddTimeDimToBatchAndZeroPad(), AddStatesFromEpisodesToBatch()):
        batch = piece(rl_module=module, batch=batch, episodes=episodes, shared_data={})
    assert list(batch) == [Columns.OBS] and batch[Columns.OBS].shape == (1, 2)


def test_add_time_dim_adds_a_time_axis_on_both_paths(make_episode, lstm_module):
    episode = make_episode()
    shared_data = {}
    batch = {Columns.OBS: np.zeros((1, 2)), "per_eps": {(episode.id_,): [np.zeros(3)]}}
    batch = AddTimeDimToBatchAndZeroPad()(
        rl_module=lstm_module, batch=batch, episodes=[episode], shared_data=shared_data
    )
    assert batch[Columns.OBS].shape == (1, 1, 2)
    assert batch["per_eps"][(episode.id_,)][0].shape == (1, 3)
    assert shared_data["_added_single_ts_time_rank"] is True


def test_add_states_after_a_cut_takes_the_state_out_from_the_lookback(make_episode, lstm_module):
    episode = make_episode(0, steps=2, extra=lstm_extra)
    successor = episode.cut(len_lookback_buffer=1)
    batch = AddStatesFromEpisodesToBatch()(rl_module=lstm_module, batch={}, episodes=[successor])
    np.testing.assert_array_equal(batch[Columns.STATE_IN][(successor.id_,)][0]["h"], np.full(4, 2.0))


def test_batch_individual_items_checks_rows_against_a_batched_obs_and_keeps_infos_a_list(make_episode):
    episodes = [make_episode(0), make_episode(1)]
    batch = {Columns.OBS: np.zeros((2, 2)), Columns.INFOS: [{"a": 1}, {"a": 2}], "t": {(episodes[0].id_,): [1]}}
    with pytest.raises(ValueError, match="one item per episode"):
        BatchIndividualItems()(rl_module=None, batch=batch, episodes=episodes, shared_data={})
    batch["t"] = {(e.id_,): [i] for i, e in enumerate(episodes)}
    out = BatchIndividualItems()(rl_module=None, batch=batch, episodes=episodes, shared_data={})
    assert out[Columns.INFOS] == [{"a": 1}, {"a": 2}]
    np.testing.assert_array_equal(out["t"], [0, 1])


def test_numpy_to_tensor_converts_once_float64_to_float32_and_read_only_arrays(make_episode):
    readonly = np.arange(4, dtype=np.float64).reshape(2, 2)
    readonly.flags.writeable = False
    batch = {Columns.OBS: {"a": readonly, "b": np.array([True, False])}, Columns.INFOS: [{}, {}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = NumpyToTensor(device="cpu")(rl_module=None, batch=batch, episodes=[])
    assert out[Columns.OBS]["a"].dtype == torch.float32 and out[Columns.OBS]["b"].dtype == torch.bool
    assert out[Columns.INFOS] == [{}, {}]
    writable = np.zeros(3, np.float32)
    shared = NumpyToTensor()(rl_module=None, batch={"x": writable}, episodes=[])["x"]
    writable[0] = 5.0
    assert shared[0] == 5.0  # no copy on the CPU


def test_mean_std_filter_normalises_with_the_batch_included_and_writes_back(make_episode, obs_space):
    episodes = [make_episode(env_id, steps=env_id) for env_id in range(4)]
    raw = np.stack([e.get_observations(-1) for e in episodes])  # [[0, 0], [1, 1], [2, 2], [3, 3]]
    piece = MeanStdFilter(obs_space, clip_by_value=1.0)
    batch = piece(rl_module=None, batch={Columns.OBS: raw.copy()}, episodes=episodes)
    expected = np.clip((raw - raw.mean(0)) / (raw.std(0, ddof=1) + 1e-8), -1.0, 1.0)
    np.testing.assert_allclose(batch[Columns.OBS], expected, rtol=1e-6)
    assert batch[Columns.OBS].dtype == np.float32
    for episode, row in zip(episodes, expected, strict=True):
        np.testing.assert_allclose(episode.get_observations(-1), row, rtol=1e-6)
        assert episode.observation_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    np.testing.assert_array_equal(episodes[3].get_observations(0), [3, 0])  # earlier steps untouched


def test_mean_std_filter_without_update_stats_keeps_the_statistics(make_episode, obs_space):
    piece = MeanStdFilter(obs_space, update_stats=False, de_std_to_one=False)
    piece.set_state(
        {
            "global": [{"count": 2, "mean": [1.0, 1.0], "m2": [2.0, 2.0]}],
            "delta": [{"count": 0, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}],
        }
    )
    episodes = [make_episode(3, steps=3)]
    piece(rl_module=None, batch={}, episodes=episodes)
    np.testing.assert_allclose(episodes[0].get_observations(-1), [2.0, 2.0])
    assert piece.get_state()["delta"][0]["count"] == 0


def test_mean_std_filter_passes_non_box_parts_of_a_dict_observation_through():
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-5, 5, (1,), np.float32), "mode": gym.spaces.Discrete(3)})
    episodes = [
        SingleAgentEpisode(observations=[{"mode": m, "pos": np.array([p], np.float32)}], observation_space=space)
        for m, p in ((0, 1.0), (2, 3.0))
    ]
    piece = MeanStdFilter(space)
    assert piece.observation_space["mode"] == gym.spaces.Discrete(3)
    batch = piece(rl_module=None, batch={}, episodes=episodes)
    assert batch == {}
    assert episodes[1].get_observations(-1)["mode"] == 2
    np.testing.assert_allclose(episodes[1].get_observations(-1)["pos"], [1 / np.sqrt(2)], rtol=1e-6)


NESTED_SPACE = gym.spaces.Dict(
    {
        "d": gym.spaces.Discrete(3, start=1),
        "box": gym.spaces.Box(-1, 1, (2, 2), np.float32),
        "tup": gym.spaces.Tuple([gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiBinary(2)]),
    }
)


def nested_obs(i):
    return {
        "box": np.full((2, 2), i / 10, np.float32),
        "d": np.int64(1 + i % 3),
        "tup": (np.array([i % 2, i % 3]), np.array([1, 0], np.int8)),
    }


def nested_episodes():
    return [SingleAgentEpisode(observations=[nested_obs(i)], observation_space=NESTED_SPACE) for i in range(3)]


def test_flatten_observations_one_hot_on_both_paths():
    piece = FlattenObservations(NESTED_SPACE)
    # Box 4 + Discrete 3 + MultiDiscrete 2 + 3 + MultiBinary 2, in the space's (sorted) key order.
    assert piece.observation_space == gym.spaces.Box(-np.inf, np.inf, (14,), np.float32)
    episodes = nested_episodes()
    obs = {
        "d": np.array([nested_obs(i)["d"] for i in range(3)]),
        "box": np.stack([nested_obs(i)["box"] for i in range(3)]),
        "tup": (np.array([[0, 0], [1, 1], [0, 2]]), np.array([[1, 0]] * 3, np.int8)),
    }
    fast = piece(rl_module=None, batch={Columns.OBS: obs}, episodes=episodes)[Columns.OBS]
    expected_row_2 = [0.2] * 4 + [0, 0, 1] + [1, 0] + [0, 0, 1] + [1, 0]
    np.testing.assert_allclose(fast[2], expected_row_2, rtol=1e-6)
    assert fast.dtype == np.float32 and fast.shape == (3, 14)
    np.testing.assert_array_equal(episodes[2].get_observations(-1), fast[2])
    slow_episodes = nested_episodes()
    assert FlattenObservations(NESTED_SPACE)(rl_module=None, batch={}, episodes=slow_episodes) == {}
    np.testing.assert_array_equal(np.stack([e.get_observations(-1) for e in slow_episodes]), fast)
    assert slow_episodes[0].observation_space == piece.observation_space


class OneHot(ObservationPreprocessor):
    """The docstring's example."""

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        return gym.spaces.Box(0.0, 1.0, (input_observation_space.n,), np.float32)

    def preprocess(self, observation, episode):
        return np.eye(self.input_observation_space.n, dtype=np.float32)[observation]


def test_observation_preprocessor_one_hot_on_both_paths():
    space = gym.spaces.Discrete(3)
    piece = OneHot(space)
    assert piece.observation_space == gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    episodes = [SingleAgentEpisode(observations=[o], observation_space=space) for o in (2, 0)]
    fast = piece(rl_module=None, batch={Columns.OBS: np.array([2, 0])}, episodes=episodes)
    np.testing.assert_array_equal(fast[Columns.OBS], [[0, 0, 1], [1, 0, 0]])
    episodes = [SingleAgentEpisode(observations=[o], observation_space=space) for o in (2, 0)]
    assert OneHot(space)(rl_module=None, batch={}, episodes=episodes) == {}
    np.testing.assert_array_equal(episodes[0].get_observations(-1), [0, 0, 1])


def test_prev_actions_prev_rewards_zero_fills_before_the_first_step(make_episode, obs_space, act_space):
    piece = PrevActionsPrevRewards(obs_space, act_space, n_prev_actions=2, n_prev_rewards=2)
    assert piece.observation_space[piece.PREV_ACTIONS_KEY].shape == (4,)
    fresh, running = make_episode(0, steps=0), make_episode(1, steps=3)  # actions 0, 1, 0; rewards 1, 2.5, 3
    obs = np.stack([fresh.get_observations(-1), running.get_observations(-1)])
    batch = piece(rl_module=None, batch={Columns.OBS: obs}, episodes=[fresh, running])
    np.testing.assert_array_equal(batch[Columns.OBS][piece.ORIG_OBS_KEY], obs)
    np.testing.assert_array_equal(batch[Columns.OBS][piece.PREV_ACTIONS_KEY], [[0, 0, 0, 0], [0, 1, 1, 0]])
    np.testing.assert_array_equal(batch[Columns.OBS][piece.PREV_REWARDS_KEY], [[0, 0], [2.5, 3]])
    np.testing.assert_array_equal(running.get_observations(-1)[piece.PREV_REWARDS_KEY], [2.5, 3])


def test_prev_actions_one_hot_a_multi_discrete_action_per_sub_action():
    """The space of a MultiDiscrete action's one-hots is sum(nvec) wide (it read a Discrete's `n`, and failed)."""
    obs_space, act_space = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.MultiDiscrete([3, 2])
    piece = PrevActionsPrevRewards(obs_space, act_space, n_prev_actions=1, n_prev_rewards=0)
    assert piece.observation_space[piece.PREV_ACTIONS_KEY].shape == (5,)
    episode = SingleAgentEpisode(
        observations=[obs_space.sample(), obs_space.sample()],
        actions=[np.array([2, 1])],
        rewards=[1.0],
        observation_space=obs_space,
        action_space=act_space,
        len_lookback_buffer=0,
    )
    piece(rl_module=None, batch={}, episodes=[episode])
    np.testing.assert_array_equal(episode.get_observations(-1)[piece.PREV_ACTIONS_KEY], [0, 0, 1, 0, 1])


def test_frame_stacking_env_to_module_matches_the_learner_stacks(make_episode, obs_space):
    episode = make_episode(7, steps=3)
    env_piece = FrameStackingEnvToModule(obs_space, num_frames=3)
    assert env_piece.observation_space.shape == (6,)
    latest = env_piece(rl_module=None, batch={Columns.OBS: np.zeros((1, 2))}, episodes=[episode])[Columns.OBS]
    np.testing.assert_array_equal(latest, [[7, 1, 7, 2, 7, 3]])
    learner = FrameStackingLearner(obs_space, num_frames=3)
    batch = learner(rl_module=None, batch={}, episodes=[episode])
    stacks = BatchIndividualItems()(rl_module=None, batch=batch, episodes=[episode], shared_data={})[Columns.OBS]
    np.testing.assert_array_equal(stacks, [[0, 0, 0, 0, 7, 0], [0, 0, 7, 0, 7, 1], [7, 0, 7, 1, 7, 2]])
    final = make_episode(7, steps=2)  # the env-to-module stack at t=2 is the learner's row for step 2
    stack_at_2 = env_piece(rl_module=None, batch={}, episodes=[final])[Columns.OBS]
    np.testing.assert_array_equal(stack_at_2[0], [7, 0, 7, 1, 7, 2])


def test_fast_path_with_nested_observations_flattened_matches_the_per_episode_path():
    act_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    flat_space = FlattenObservations(NESTED_SPACE).observation_space
    torch.manual_seed(0)
    module = build_module(flat_space, act_space, ModelConfig(fcnet_hiddens=(8,)))

    def pipelines():
        return (
            build_env_to_module_pipeline(
                NESTED_SPACE, act_space, env_to_module_connector=lambda o, a: FlattenObservations()
            ),
            build_module_to_env_pipeline(NESTED_SPACE, act_space),
        )

    def make_episodes():
        return [
            SingleAgentEpisode(observations=[nested_obs(i)], observation_space=NESTED_SPACE, action_space=act_space)
            for i in range(3)
        ]

    def fast_batch(episodes):
        return {Columns.OBS: batch_items([e.get_observations(-1) for e in episodes])}

    (fast, fast_env, _, _), (slow, slow_env, _, _) = run_both_paths(make_episodes, pipelines, module, fast_batch)
    assert fast[Columns.OBS].shape == (3, 14)
    assert_same(fast, slow)
    assert_same(fast_env, slow_env)
    assert np.all(np.abs(fast_env[Columns.ACTIONS_FOR_ENV]) <= 2.0)
