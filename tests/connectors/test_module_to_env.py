"""Module-to-env pieces: from module outputs to raw actions for the episode and actions for the env."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.connectors import Columns, ConnectorV2
from rlgate.connectors.builders import build_module_to_env_pipeline
from rlgate.connectors.common import TensorToNumpy
from rlgate.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)

LOGITS = torch.tensor([[0.0, 5.0], [3.0, 0.0], [0.0, 0.0]])


def test_get_actions_samples_and_adds_logp_when_exploring(module):
    torch.manual_seed(0)
    batch = GetActions()(rl_module=module, batch={Columns.ACTION_DIST_INPUTS: LOGITS}, episodes=[], explore=True)
    actions = batch[Columns.ACTIONS]
    assert actions.shape == (3,)
    torch.testing.assert_close(batch[Columns.ACTION_LOGP], torch.log_softmax(LOGITS, -1)[torch.arange(3), actions])


def test_get_actions_is_greedy_without_logp_when_not_exploring(module):
    batch = GetActions()(rl_module=module, batch={Columns.ACTION_DIST_INPUTS: LOGITS}, episodes=[], explore=False)
    assert batch[Columns.ACTIONS].tolist() == [1, 0, 0]
    assert Columns.ACTION_LOGP not in batch


def test_get_actions_leaves_given_actions_alone(module):
    batch = {Columns.ACTION_DIST_INPUTS: LOGITS, Columns.ACTIONS: torch.tensor([0, 0, 1])}
    out = GetActions()(rl_module=module, batch=batch, episodes=[], explore=True)
    assert out[Columns.ACTIONS].tolist() == [0, 0, 1] and Columns.ACTION_LOGP not in out


def test_normalize_and_clip_unsquashes_or_clips_and_keeps_raw_actions():
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    raw = np.array([[0.0], [1.0], [3.0], [-0.5]], np.float32)
    unsquash = NormalizeAndClipActions(None, space, normalize_actions=True, clip_actions=False)
    out = unsquash(rl_module=None, batch={Columns.ACTIONS: raw}, episodes=[])
    np.testing.assert_allclose(out[Columns.ACTIONS_FOR_ENV], [[0.0], [2.0], [2.0], [-1.0]])
    np.testing.assert_array_equal(out[Columns.ACTIONS], [[0.0], [1.0], [3.0], [-0.5]])
    clip = NormalizeAndClipActions(None, space, normalize_actions=False, clip_actions=True)
    per_episode = {("e",): [np.array([3.0]), np.array([-0.5])]}
    out = clip(rl_module=None, batch={Columns.ACTIONS: per_episode}, episodes=[])
    np.testing.assert_allclose(out[Columns.ACTIONS_FOR_ENV][("e",)], [[2.0], [-0.5]])
    neither = NormalizeAndClipActions(None, space, normalize_actions=False, clip_actions=False)
    assert neither(rl_module=None, batch={Columns.ACTIONS: raw}, episodes=[])[Columns.ACTIONS_FOR_ENV] is raw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalize_actions_maps_into_bounds_as_wide_as_the_dtype(dtype):
    """high - low overflows to inf for such bounds: every action came out as high."""
    limit = np.finfo(dtype).max
    space = gym.spaces.Box(-limit, limit, (5,), dtype)
    raw = np.array([[-1.0, -0.5, 0.0, 0.5, 1.0], [-3.0, 0.25, -0.25, 3.0, 0.0]], np.float32)
    piece = NormalizeAndClipActions(None, space, normalize_actions=True, clip_actions=False)
    out = piece(rl_module=None, batch={Columns.ACTIONS: raw}, episodes=[])[Columns.ACTIONS_FOR_ENV]
    assert out.dtype == dtype
    np.testing.assert_allclose(out / limit, np.clip(raw, -1.0, 1.0), rtol=1e-6)


def test_normalize_actions_shifts_integer_boxes_and_maps_nested_spaces():
    space = gym.spaces.Dict({"i": gym.spaces.Box(3, 9, (), np.int64), "f": gym.spaces.Box(0.0, 10.0, (), np.float32)})
    piece = NormalizeAndClipActions(None, space, normalize_actions=True, clip_actions=False)
    actions = {"i": np.array([0, 2]), "f": np.array([-1.0, 0.0], np.float32)}
    out = piece(rl_module=None, batch={Columns.ACTIONS: actions}, episodes=[])[Columns.ACTIONS_FOR_ENV]
    np.testing.assert_array_equal(out["i"], [3, 5])
    np.testing.assert_allclose(out["f"], [0.0, 5.0])


def test_remove_single_ts_time_rank_only_after_env_to_module_added_it():
    batch = {Columns.ACTIONS: np.zeros((2, 1)), Columns.STATE_OUT: {"h": np.zeros((2, 1))}}
    same = RemoveSingleTsTimeRankFromBatch()(rl_module=None, batch=dict(batch), episodes=[], shared_data={})
    assert same[Columns.ACTIONS].shape == (2, 1)
    shared_data = {"_added_single_ts_time_rank": True}
    out = RemoveSingleTsTimeRankFromBatch()(rl_module=None, batch=batch, episodes=[], shared_data=shared_data)
    assert out[Columns.ACTIONS].shape == (2,) and out[Columns.STATE_OUT]["h"].shape == (2, 1)
    per_episode = {Columns.VF_PREDS: {("e",): [np.array([1.5])]}}
    out = RemoveSingleTsTimeRankFromBatch()(rl_module=None, batch=per_episode, episodes=[], shared_data=shared_data)
    assert out[Columns.VF_PREDS][("e",)][0].shape == ()


def test_unbatch_then_listify_returns_to_arrays_and_batched_columns_stay(make_episode):
    episodes = [make_episode(0), make_episode(1)]
    batch = {Columns.ACTIONS: np.array([1, 0]), Columns.STATE_OUT: {"h": np.array([[1.0], [2.0]])}}
    shared_data = {"memorized_map_structure": [e.id_ for e in episodes]}
    split = UnBatchToIndividualItems()(rl_module=None, batch=dict(batch), episodes=episodes, shared_data=shared_data)
    assert split[Columns.ACTIONS] == {(episodes[0].id_,): [1], (episodes[1].id_,): [0]}
    assert split[Columns.STATE_OUT][(episodes[1].id_,)][0]["h"].tolist() == [2.0]
    back = ListifyDataForVectorEnv()(rl_module=None, batch=split, episodes=episodes)
    np.testing.assert_array_equal(back[Columns.ACTIONS], [1, 0])
    np.testing.assert_array_equal(back[Columns.STATE_OUT]["h"], [[1.0], [2.0]])
    kept = UnBatchToIndividualItems()(rl_module=None, batch=dict(batch), episodes=episodes, shared_data={})
    assert kept[Columns.ACTIONS] is batch[Columns.ACTIONS]
    assert (
        ListifyDataForVectorEnv()(rl_module=None, batch=kept, episodes=episodes)[Columns.ACTIONS]
        is batch[Columns.ACTIONS]
    )


def test_tensor_to_numpy_converts_nested_tensors():
    batch = {"a": torch.ones(2, requires_grad=True) * 2, "s": {"h": torch.zeros(2, 3)}, "n": np.ones(1, np.float32)}
    out = TensorToNumpy()(rl_module=None, batch=batch, episodes=[])
    assert isinstance(out["a"], np.ndarray) and out["a"].tolist() == [2.0, 2.0]
    assert out["s"]["h"].shape == (2, 3) and out["n"] is batch["n"]  # float32 numpy is passed through


class FlipActions(ConnectorV2):
    """A per-item user piece (RLlib style) in module-to-env, before NormalizeAndClipActions."""

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        self.foreach_batch_item_change_in_place(batch, Columns.ACTIONS, lambda action, *ids: 1 - action)
        return batch


def test_a_per_item_user_piece_works_on_both_module_to_env_paths(make_episode, module, obs_space, act_space):
    episodes = [make_episode(0), make_episode(1), make_episode(2)]
    outputs = []
    for shared_data in ({}, {"memorized_map_structure": [e.id_ for e in episodes]}):
        pipeline = build_module_to_env_pipeline(
            obs_space, act_space, module_to_env_connector=lambda o, a: FlipActions()
        )
        batch = {Columns.ACTION_DIST_INPUTS: LOGITS, Columns.VF_PREDS: torch.tensor([1.0, 2.0, 3.0])}
        outputs.append(
            pipeline(rl_module=module, batch=batch, episodes=episodes, explore=False, shared_data=shared_data)
        )
    for out in outputs:
        assert out[Columns.ACTIONS].tolist() == [0, 1, 1]
        assert out[Columns.ACTIONS_FOR_ENV].tolist() == [0, 1, 1]
        assert out[Columns.VF_PREDS].tolist() == [1.0, 2.0, 3.0]
