"""The acting core's batched fast path: with the default pieces only the acting ones run, with the pipelines'
outputs; a user's piece that does not promise to take a batched OBS makes the pipelines run from an empty batch."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors import ConnectorV2
from rlgate.core.columns import Columns
from rlgate.episodes.session import Session, SessionSpec
from rlgate.policy.acting import ActingCore
from rlgate.policy.fast_path import batched_pieces
from rlgate.spec.run import RunSpec

BOX3 = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
LOW, HIGH = np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32)
SPACES = {
    "discrete": (BOX3, gym.spaces.Discrete(3)),
    "bounded-box": (BOX3, gym.spaces.Box(LOW, HIGH, (2,), np.float32)),
    "unbounded-box": (BOX3, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)),
    "multi-discrete": (BOX3, gym.spaces.MultiDiscrete([3, 4])),
}


def policy_and_rows(spec: RunSpec, observation_space: gym.Space, action_space: gym.Space, num_envs: int):
    policy = ActingCore.build(spec, observation_space, action_space, seed=0)
    return (policy, *rows(observation_space, action_space, num_envs))


def rows(observation_space: gym.Space, action_space: gym.Space, num_envs: int):
    """A fresh session's first step: its observations and its rows (episodes), as the server hands them over."""
    session = Session(
        SessionSpec("t", observation_space, action_space, num_envs, True), rollout_fragment_length=None, lookback=1
    )
    obs = np.stack([observation_space.sample() for _ in range(num_envs)])
    zeros = np.zeros(num_envs, bool)
    episodes, _ = session.observe(obs, np.zeros(num_envs, np.float32), zeros, zeros, None)
    return obs, episodes


@pytest.mark.parametrize("explore", [True, False], ids=["explore", "greedy"])
@pytest.mark.parametrize("spaces", SPACES.values(), ids=SPACES.keys())
def test_the_acting_pieces_give_the_pipelines_outputs_bit_for_bit(spaces, explore):
    """Same seed, same rows: every output column of the acting pieces alone equals the full pipelines' (values,
    dtype and shape), including the sampled actions, their log-probabilities and the actions for the env."""
    policy, obs, episodes = policy_and_rows(RunSpec(), *spaces, num_envs=5)
    pieces = batched_pieces(policy.module, policy.env_to_module, policy.module_to_env)
    assert pieces is not None and len(pieces[0]) == 1  # NumpyToTensor alone
    torch.manual_seed(1)
    outputs = policy.act(episodes, explore, obs)
    torch.manual_seed(1)
    with torch.inference_mode():
        common = {"rl_module": policy.module, "episodes": episodes, "explore": explore}
        batch = policy.env_to_module(batch={Columns.OBS: obs}, shared_data=(shared := {}), **common)
        forward = policy.module.forward_exploration if explore else policy.module.forward_inference
        expected = policy.module_to_env(batch=forward(batch), shared_data=shared, **common)
    assert set(outputs) == {*expected, Columns.MODEL_VERSION}
    for column, array in expected.items():
        assert outputs[column].dtype == array.dtype, column
        np.testing.assert_array_equal(outputs[column], array, err_msg=column)
    if spaces[1] is SPACES["bounded-box"][1]:  # unsquashed into the bounds: the env's actions are not the module's
        assert not np.array_equal(outputs[Columns.ACTIONS_FOR_ENV], outputs[Columns.ACTIONS])


def test_another_piece_or_a_stateful_module_runs_the_pipelines_whole():
    """Anything but the default pieces with a stateless module: no shortcut, every piece runs."""
    piece = RunSpec.model_validate({"connectors": {"env_to_module": [{"type": "MeanStdFilter"}]}})
    lstm = RunSpec.model_validate({"model": {"config": {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4}}})
    for spec in (piece, lstm):
        policy, _, _ = policy_and_rows(spec, *SPACES["discrete"], num_envs=2)
        pieces = batched_pieces(policy.module, policy.env_to_module, policy.module_to_env)
        assert pieces == ([policy.env_to_module], [policy.module_to_env])
    default, _, _ = policy_and_rows(RunSpec(), *SPACES["discrete"], num_envs=2)
    acting = batched_pieces(default.module, default.env_to_module, default.module_to_env)
    assert acting is not None
    assert [type(piece).__name__ for pieces in acting for piece in pieces] == [
        "NumpyToTensor", "GetActions", "TensorToNumpy", "NormalizeAndClipActions"
    ]  # fmt: skip


class Negate(ConnectorV2):
    """A user's piece written RLlib's way: it rewrites each episode's latest observation and returns the batch."""

    def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kwargs):
        for episode in self.single_agent_episode_iterator(episodes):
            episode.set_observations(new_data=-episode.get_observations(-1), at_indices=-1)
        return batch


class NegateBatchedToo(Negate):
    """Negate, promising to take a batched OBS: it negates that OBS as well."""

    accepts_batched_obs = True

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        batch = super().__call__(rl_module=rl_module, batch=batch, episodes=episodes, **kwargs)
        if Columns.OBS in batch:
            batch[Columns.OBS] = -batch[Columns.OBS]
        return batch


def test_a_piece_that_does_not_take_a_batched_obs_runs_the_pipelines_from_an_empty_batch():
    """The module sees what the piece wrote into the episodes, as in RLlib: the batched OBS handed in is not used."""
    policy, obs, episodes = policy_and_rows(RunSpec(), *SPACES["discrete"], num_envs=3)
    policy.env_to_module.prepend(Negate())
    assert not policy.env_to_module.takes_batched_obs()
    assert batched_pieces(policy.module, policy.env_to_module, policy.module_to_env) is None
    negated = policy.act(episodes, False, obs)[Columns.ACTION_DIST_INPUTS]
    assert all(np.array_equal(episode.get_observations(-1), -row) for episode, row in zip(episodes, obs, strict=True))
    policy.env_to_module.remove(Negate)
    _, fresh = rows(*SPACES["discrete"], num_envs=3)
    np.testing.assert_array_equal(policy.act(fresh, False, -obs)[Columns.ACTION_DIST_INPUTS], negated)


def test_a_subclass_that_overrides_call_does_not_inherit_the_promise():
    """accepts_batched_obs holds for the class whose __call__ made it; a subclass's own __call__ must say it again."""

    class Overrides(NegateBatchedToo):
        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            return batch

    assert NegateBatchedToo().takes_batched_obs()
    assert not Overrides().takes_batched_obs()
    assert not Negate().takes_batched_obs()


def test_a_piece_added_after_the_policy_was_built_runs():
    """Editing a pipeline of a built policy (as a user's code may) takes effect from the next batch on."""
    policy, obs, episodes = policy_and_rows(RunSpec(), *SPACES["discrete"], num_envs=3)
    before = policy.act(episodes, False, obs)[Columns.ACTION_DIST_INPUTS]
    policy.env_to_module.prepend(NegateBatchedToo())
    _, episodes = rows(*SPACES["discrete"], num_envs=3)
    negated = policy.act(episodes, False, obs)[Columns.ACTION_DIST_INPUTS]
    assert not np.array_equal(negated, before)
    policy.env_to_module.remove(NegateBatchedToo)  # and back to the acting pieces alone
    np.testing.assert_array_equal(policy.act(episodes, False, -obs)[Columns.ACTION_DIST_INPUTS], negated)
    assert policy.act(episodes, False, obs)[Columns.ACTION_DIST_INPUTS].tolist() == before.tolist()
