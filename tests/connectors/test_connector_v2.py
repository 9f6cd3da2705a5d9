"""ConnectorV2: spaces, the batch helpers and the episode iterator."""

import gymnasium as gym
import numpy as np
import pytest

from rlgate.connectors import ConnectorV2
from rlgate.connectors.batching import BatchedNdArray, batch_items, is_batched


class Identity(ConnectorV2):
    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        return batch


class OneHot(ConnectorV2):
    """Discrete obs -> one-hot Box; action space n doubled (to see both spaces recomputed)."""

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        return gym.spaces.Box(0.0, 1.0, (input_observation_space.n,), np.float32)

    def recompute_output_action_space(self, input_observation_space, input_action_space):
        return gym.spaces.Discrete(input_action_space.n * 2)

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        return batch


def test_spaces_default_to_the_input_spaces():
    piece = Identity(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    assert piece.observation_space == gym.spaces.Discrete(3)
    assert piece.action_space == gym.spaces.Discrete(2)
    assert Identity().observation_space is None and Identity().action_space is None


def test_setting_an_input_space_recomputes_the_output_spaces():
    piece = OneHot()
    piece.input_observation_space = gym.spaces.Discrete(3)
    assert piece.observation_space == gym.spaces.Box(0.0, 1.0, (3,), np.float32)
    assert piece.action_space is None
    piece.input_action_space = gym.spaces.Discrete(4)
    assert piece.action_space == gym.spaces.Discrete(8)
    piece.input_observation_space = gym.spaces.Discrete(5)
    assert piece.observation_space.shape == (5,)
    assert piece.name == "OneHot" and str(piece) == "OneHot"


def test_add_batch_item_without_and_with_an_episode(make_episode):
    batch = {}
    ConnectorV2.add_batch_item(batch, "col", 5)
    ConnectorV2.add_batch_item(batch, "col", 6)
    assert batch == {"col": [5, 6]}
    episode = make_episode()
    ConnectorV2.add_batch_item(batch, "per_eps", 1, episode)
    ConnectorV2.add_batch_item(batch, "per_eps", 2, episode)
    assert batch["per_eps"] == {(episode.id_,): [1, 2]}


def test_add_batch_item_keys_an_agent_episode_by_multi_agent_id_agent_and_module(make_episode):
    episode = make_episode()
    episode.agent_id, episode.module_id, episode.multi_agent_episode_id = "ag0", "mod0", "MA"
    batch = {}
    ConnectorV2.add_batch_item(batch, "col", 1, episode)
    assert batch == {"col": {("MA", "ag0", "mod0"): [1]}}


def test_add_n_batch_items_takes_a_list_or_one_batched_item(make_episode):
    episode = make_episode()
    batch = {}
    ConnectorV2.add_n_batch_items(batch, "col", [1, 2], 2, episode)
    ConnectorV2.add_n_batch_items(batch, "col", {"a": np.array([3, 4, 5])}, 3, episode)
    items = batch["col"][(episode.id_,)]
    assert items[:2] == [1, 2]
    assert isinstance(items[2]["a"], BatchedNdArray)
    with pytest.raises(ValueError, match="num_items"):
        ConnectorV2.add_n_batch_items(batch, "col", [1, 2], 3)


def test_batch_items_stacks_single_items_and_concatenates_batched_ones():
    stacked = batch_items([{"a": np.array([1, 2])}, {"a": np.array([3, 4])}])
    np.testing.assert_array_equal(stacked["a"], [[1, 2], [3, 4]])
    mixed = batch_items([np.array([1.0, 2.0]).view(BatchedNdArray), 3.0])
    np.testing.assert_array_equal(mixed, [1.0, 2.0, 3.0])
    assert type(mixed) is np.ndarray


def test_is_batched_tells_per_episode_columns_from_batched_ones():
    assert is_batched(np.zeros(3)) and is_batched({"a": np.zeros(3)}) and is_batched((np.zeros(3),))
    assert not is_batched([1, 2]) and not is_batched({("eps",): [1]})


def test_foreach_batch_item_change_in_place_on_lists_episodes_and_several_columns():
    batch = {"a": [0, 1], "b": [0, -1]}
    ConnectorV2.foreach_batch_item_change_in_place(batch, "a", lambda item, *ids: item + 1)
    assert batch["a"] == [1, 2]
    ConnectorV2.foreach_batch_item_change_in_place(batch, ["a", "b"], lambda items, *ids: (items[0], -items[1]))
    assert batch == {"a": [1, 2], "b": [0, 1]}
    batch = {"a": {("e1",): [1, 2], ("e2",): [10]}}
    seen = []

    def record(item, eps_id, agent_id, module_id):
        seen.append((eps_id, agent_id, module_id))
        return item * 2 if eps_id == "e1" else item

    ConnectorV2.foreach_batch_item_change_in_place(batch, "a", record)
    assert batch["a"] == {("e1",): [2, 4], ("e2",): [10]}
    assert seen == [("e1", None, None), ("e1", None, None), ("e2", None, None)]
    with pytest.raises(ValueError, match="not in the batch"):
        ConnectorV2.foreach_batch_item_change_in_place(batch, "missing", record)


def test_foreach_batch_item_change_in_place_on_a_batched_column_maps_rows():
    batch = {"a": np.array([[1, 2], [3, 4]])}
    ConnectorV2.foreach_batch_item_change_in_place(batch, "a", lambda row, *ids: row[::-1] * 10)
    np.testing.assert_array_equal(batch["a"], [[20, 10], [40, 30]])


def test_single_agent_episode_iterator_zips_every_column_form(make_episode):
    episodes = [make_episode(0), make_episode(1)]
    assert list(ConnectorV2.single_agent_episode_iterator(episodes)) == episodes
    as_list = list(ConnectorV2.single_agent_episode_iterator(episodes, zip_with_batch_column=["x", "y"]))
    assert as_list == [(episodes[0], "x"), (episodes[1], "y")]
    per_episode = {(episodes[1].id_,): ["b"], (episodes[0].id_,): ["a"]}
    zipped = list(ConnectorV2.single_agent_episode_iterator(episodes, zip_with_batch_column=per_episode))
    assert zipped == [(episodes[0], "a"), (episodes[1], "b")]
    rows = list(ConnectorV2.single_agent_episode_iterator(episodes, zip_with_batch_column={"o": np.eye(2)}))
    np.testing.assert_array_equal(rows[1][1]["o"], [0, 1])
    with pytest.raises(ValueError, match="3 items but there are 2 episodes"):
        list(ConnectorV2.single_agent_episode_iterator(episodes, zip_with_batch_column=np.zeros(3)))
