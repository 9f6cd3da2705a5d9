"""ConnectorPipelineV2: editing, indexing, space propagation, state by name, nesting and timings."""

import gymnasium as gym
import numpy as np
import pytest

from rlgate.connectors import ConnectorPipelineV2, ConnectorV2
from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter, PrevActionsPrevRewards


class AddOne(ConnectorV2):
    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        batch.setdefault("trace", []).append(self.name)
        return batch


class AddTwo(AddOne):
    pass


class AddThree(AddOne):
    pass


def names(pipeline):
    return [c.name for c in pipeline.connectors]


def test_append_prepend_insert_and_remove_by_class_or_name():
    pipeline = ConnectorPipelineV2(connectors=[AddOne()])
    pipeline.append(AddThree())
    pipeline.prepend(AddTwo())
    assert names(pipeline) == ["AddTwo", "AddOne", "AddThree"]
    anchor = pipeline.insert_after(AddOne, ConnectorPipelineV2(connectors=[]))
    assert anchor.name == "AddOne"
    assert names(pipeline) == ["AddTwo", "AddOne", "ConnectorPipelineV2", "AddThree"]
    removed = pipeline.remove("ConnectorPipelineV2")
    assert isinstance(removed, ConnectorPipelineV2)
    pipeline.remove(AddTwo)
    assert pipeline.insert_before("AddThree", AddTwo()).name == "AddThree"
    assert names(pipeline) == ["AddOne", "AddTwo", "AddThree"]
    assert pipeline(rl_module=None, batch={}, episodes=[])["trace"] == ["AddOne", "AddTwo", "AddThree"]


@pytest.mark.parametrize("edit", ["insert_before", "insert_after", "remove"])
def test_a_missing_anchor_raises_value_error(edit):
    pipeline = ConnectorPipelineV2(connectors=[AddOne()])
    args = ("AddTwo",) if edit == "remove" else ("AddTwo", AddThree())
    with pytest.raises(ValueError, match="no connector piece 'AddTwo'"):
        getattr(pipeline, edit)(*args)
    assert names(pipeline) == ["AddOne"]


def test_only_connector_pieces_are_accepted():
    pipeline = ConnectorPipelineV2(connectors=[AddOne()])
    with pytest.raises(TypeError):
        pipeline.append(lambda **kwargs: kwargs)
    with pytest.raises(TypeError):
        ConnectorPipelineV2(connectors=[object()])


def test_indexing_by_position_class_and_name():
    one, two = AddOne(), AddTwo()
    pipeline = ConnectorPipelineV2(connectors=[one, two])
    assert pipeline[0] is one and pipeline[-1] is two
    assert pipeline[AddTwo] == [two] and pipeline["AddOne"] is one
    assert len(pipeline) == 2
    with pytest.raises(KeyError):
        pipeline["AddThree"]


def test_spaces_propagate_through_every_piece_and_after_edits():
    obs_space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2,))})
    act_space = gym.spaces.Discrete(2)
    pipeline = ConnectorPipelineV2(obs_space, act_space, connectors=[FlattenObservations()])
    assert pipeline.observation_space == gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    pipeline.append(PrevActionsPrevRewards(n_prev_actions=2))
    assert pipeline[1].input_observation_space.shape == (5,)
    assert pipeline.observation_space[PrevActionsPrevRewards.PREV_ACTIONS_KEY].shape == (4,)
    pipeline.remove(FlattenObservations)
    assert pipeline[0].input_observation_space == obs_space
    assert pipeline.observation_space[PrevActionsPrevRewards.ORIG_OBS_KEY] == obs_space
    assert pipeline.action_space == act_space
    pipeline.input_observation_space = gym.spaces.Box(-1, 1, (7,))
    assert pipeline.observation_space[PrevActionsPrevRewards.ORIG_OBS_KEY].shape == (7,)


def test_nested_pipelines_run_and_propagate_spaces():
    inner = ConnectorPipelineV2(connectors=[AddTwo(), FlattenObservations()])
    outer = ConnectorPipelineV2(gym.spaces.Discrete(4), gym.spaces.Discrete(2), connectors=[AddOne(), inner])
    assert inner.input_observation_space == gym.spaces.Discrete(4)
    assert outer.observation_space.shape == (4,)
    metrics = {}
    batch = outer(rl_module=None, batch={}, episodes=[], metrics=metrics)
    assert batch["trace"] == ["AddOne", "AddTwo"]
    assert set(metrics) == {"AddOne", "AddTwo", "FlattenObservations", "ConnectorPipelineV2"}
    assert all(seconds >= 0 for seconds in metrics.values())
    outer(rl_module=None, batch={}, episodes=[], metrics=metrics)
    assert metrics["AddOne"] > 0


def test_state_is_keyed_by_piece_name_and_merges_by_name(make_episode, obs_space, act_space):
    def pipeline():
        return ConnectorPipelineV2(obs_space, act_space, connectors=[AddOne(), MeanStdFilter()])

    servers = [pipeline(), pipeline()]
    for server, env_ids in zip(servers, ([1, 3], [5, 7]), strict=True):
        server(rl_module=None, batch={}, episodes=[make_episode(env_id) for env_id in env_ids])
    states = [server.get_state() for server in servers]
    assert list(states[0]) == ["MeanStdFilter"]  # the stateless AddOne is left out
    coordinator = pipeline()
    merged = coordinator.merge_states(states)
    # RLlib 2.60 pairs states[0]'s entries with pieces by position, i.e. MeanStdFilter's with AddOne.
    assert merged["MeanStdFilter"]["global"][0]["count"] == 4
    np.testing.assert_allclose(merged["MeanStdFilter"]["global"][0]["mean"], [4.0, 3.0])
    coordinator.set_state(merged)
    assert coordinator.get_state()["MeanStdFilter"]["global"][0]["count"] == 4
    with pytest.raises(KeyError):
        coordinator.set_state({"NoSuchPiece": {}})
    coordinator.reset_state()
    assert coordinator.get_state()["MeanStdFilter"]["global"][0]["count"] == 0


def test_a_state_from_elsewhere_is_checked_piece_by_piece(obs_space, act_space):
    pipeline = ConnectorPipelineV2(obs_space, act_space, connectors=[AddOne(), MeanStdFilter()])
    pipeline.check_state(pipeline.get_state())
    pipeline.check_state({})  # pieces may be left out, as merge_states and set_state allow
    with pytest.raises(ValueError, match="no connector piece 'NoSuchPiece' in the pipeline"):
        pipeline.check_state({"NoSuchPiece": {}})
    with pytest.raises(ValueError, match=r"^MeanStdFilter: a MeanStdFilter state is global and delta"):
        pipeline.check_state({"MeanStdFilter": {}})
    with pytest.raises(ValueError, match="a pipeline state is a dict by piece key, not tuple"):
        pipeline.check_state(())


def test_a_piece_must_return_the_batch():
    class Broken(ConnectorV2):
        def __call__(self, **kwargs):
            return None

    with pytest.raises(ValueError, match="Broken returned NoneType"):
        ConnectorPipelineV2(connectors=[Broken()])(rl_module=None, batch={}, episodes=[])
