"""Connector behaviours checked against RLlib 2.60 itself.

The expected values were printed by RLlib 2.60 (`ray[rllib]==2.60.0`, torch 2.13.0, numpy 2.4) running its
own pieces on the same inputs, in a scratch venv outside the repo (ray is never imported here). Where
rlgate keeps a deliberate difference, the test says what RLlib did and asserts rlgate's documented
behaviour.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.agent_traces import replay, trace

from rlgate.connectors import Columns, ConnectorPipelineV2, ConnectorV2
from rlgate.connectors.builders import build_learner_pipeline
from rlgate.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AgentToModuleMapping,
    BatchIndividualItems,
    TensorToNumpy,
)
from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter, PrevActionsPrevRewards
from rlgate.connectors.learner import AddOneTsToEpisodesAndTruncate
from rlgate.connectors.module_to_env import GetActions
from rlgate.connectors.module_to_env.normalize_and_clip_actions import unsquash_action
from rlgate.episodes import MultiAgentEpisode, SingleAgentEpisode
from rlgate.models.distributions import Categorical, DiagGaussian

BOX = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)
ACTIONS = gym.spaces.Discrete(2)


class Counter(ConnectorV2):
    """A stateful piece whose state says which piece it came from (`tag`) and how often it ran."""

    def __init__(self, *args, tag: str = "", step: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tag, self.step, self.n, self.got = tag, step, 0, None

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        self.n += self.step
        return batch

    def get_state(self):
        return {"tag": self.tag, "n": self.n}

    def set_state(self, state):
        self.n, self.got = state["n"], state["tag"]

    def merge_states(self, states):
        return {"tag": f"{self.tag}-merged", "n": sum(s["n"] for s in states)}


def test_two_pieces_of_one_class_edit_at_the_first_as_rllib_does():
    """RLlib: insert_after(Counter) in [A, B] gives [A, N, B]; remove(Counter) then gives [N, B]."""
    a, b = Counter(tag="A"), Counter(tag="B")
    pipeline = ConnectorPipelineV2(BOX, ACTIONS, connectors=[a, b])
    assert pipeline.insert_after(Counter, Counter(tag="N")) is a
    assert [c.tag for c in pipeline.connectors] == ["A", "N", "B"]
    assert pipeline.remove(Counter) is a
    assert [c.tag for c in pipeline.connectors] == ["N", "B"]
    assert pipeline.insert_before("Counter", Counter(tag="F")).tag == "N"
    assert [c.tag for c in pipeline.connectors] == ["F", "N", "B"]
    assert [c.tag for c in pipeline[Counter]] == ["F", "N", "B"]


def test_indexing_by_class_gives_every_piece_of_it_or_a_subclass_as_rllib():
    """RLlib: pipeline[Counter] on [Counter, Sub(Counter), Counter] lists all three, pipeline[Sub] the one, a class
    without pieces []; pipeline[i] is one piece; a slice raises NotImplementedError."""

    class Sub(Counter):
        pass

    first, sub, last = Counter(tag="A"), Sub(tag="S"), Counter(tag="B")
    pipeline = ConnectorPipelineV2(BOX, ACTIONS, connectors=[first, sub, last])
    assert pipeline[Counter] == [first, sub, last] and pipeline[Sub] == [sub]
    assert pipeline[MeanStdFilter] == [] and pipeline[-1] is last
    assert pipeline[Counter][0] is first
    with pytest.raises(NotImplementedError):
        pipeline[0:2]


def test_a_piece_that_returns_no_dict_is_a_value_error_as_rllib():
    """RLlib raises ValueError ("`data` returned by ConnectorV2 ... must be a dict!") for a piece returning [1]."""

    class ReturnsList(ConnectorV2):
        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            return [1]

    with pytest.raises(ValueError, match="ReturnsList returned list, not the batch dict"):
        ConnectorPipelineV2(connectors=[Counter(), ReturnsList()])(rl_module=None, batch={}, episodes=[])


def test_two_pieces_of_one_class_keep_their_own_state_and_share_one_timing():
    """RLlib 2.60 keys all of this by class name alone. With [A (step 1), B (step 10)] run 3 times:
    get_state() == {"Counter": {"tag": "B", "n": 30}} (A's state is lost); set_state({"Counter": X})
    gives X to both pieces; merge_states([s, s]) == {"Counter": {"tag": "A-merged", "n": 60}} (B's
    states merged by A); its timer `timers/connectors/counter` takes both pieces' times. Here (a
    deliberate difference) the state is keyed `Counter`, `Counter#2`; the timing is one entry, as RLlib's.
    """
    a, b = Counter(tag="A", step=1), Counter(tag="B", step=10)
    pipeline = ConnectorPipelineV2(BOX, ACTIONS, connectors=[a, b])
    metrics: dict[str, float] = {}
    for _ in range(3):
        pipeline(rl_module=None, batch={}, episodes=[], metrics=metrics)
    assert list(metrics) == ["Counter"] and metrics["Counter"] > 0
    assert pipeline.state_keys() == ["Counter", "Counter#2"]
    state = pipeline.get_state()
    assert state == {"Counter": {"tag": "A", "n": 3}, "Counter#2": {"tag": "B", "n": 30}}

    c, d = Counter(tag="C"), Counter(tag="D")
    restored = ConnectorPipelineV2(BOX, ACTIONS, connectors=[c, d])
    restored.set_state(state)
    assert (c.n, c.got, d.n, d.got) == (3, "A", 30, "B")
    assert restored.merge_states([state, state]) == {
        "Counter": {"tag": "C-merged", "n": 6},
        "Counter#2": {"tag": "D-merged", "n": 60},
    }
    with pytest.raises(KeyError, match="Counter#3"):
        restored.set_state({"Counter#3": {"tag": "X", "n": 1}})
    assert (c.n, d.n) == (3, 30)  # a state naming an unknown piece changes nothing


def test_merge_states_pairs_by_key_even_after_a_stateless_piece():
    """RLlib: [TensorToNumpy, Counter].merge_states([{"Counter": ...}]) == {"Counter": {}} (the entry is
    merged by the piece at its position, TensorToNumpy, and the statistics are lost)."""
    pipeline = ConnectorPipelineV2(BOX, ACTIONS, connectors=[TensorToNumpy(), Counter(tag="E")])
    assert pipeline.merge_states([{"Counter": {"tag": "E", "n": 2}}]) == {"Counter": {"tag": "E-merged", "n": 2}}


def serve(pipeline: ConnectorPipelineV2, obs: np.ndarray) -> np.ndarray:
    """One fast-path call on fresh episodes; returns the observations after the pipeline."""
    episodes = [
        SingleAgentEpisode(observations=[row], observation_space=pipeline.input_observation_space) for row in obs
    ]
    return pipeline(rl_module=None, batch={Columns.OBS: obs}, episodes=episodes)[Columns.OBS]


def test_two_mean_std_filters_sync_their_own_statistics_across_servers():
    """Two servers and a learner, each with [MeanStdFilter (de-mean only), MeanStdFilter]: the deltas travel as
    server.host.core.take_connector_delta and the learner's merge send them, and each piece's statistics merge
    with its own (the first's are the raw observations', the second's those of the first's output)."""
    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def pipeline() -> ConnectorPipelineV2:
        return ConnectorPipelineV2(space, ACTIONS, connectors=[MeanStdFilter(de_std_to_one=False), MeanStdFilter()])

    rng = np.random.default_rng(0)
    servers, learner = [pipeline(), pipeline()], pipeline()
    raw, demeaned = [], []
    for i, server in enumerate(servers):
        obs = rng.normal(5.0 * i, 1.0 + i, size=(6 + i, 2)).astype(np.float32)
        serve(server, obs)
        raw.append(obs)
        demeaned.append(obs - _mean(server[0].get_state()))
        delta = server.get_state()  # take_connector_delta: the state out, merged into the server's own
        server.set_state(server.merge_states([delta]))
        learner.set_state(learner.merge_states([delta]))  # the learner's _merge_connector_state
    merged = learner.get_state()
    assert set(merged) == {"MeanStdFilter", "MeanStdFilter#2"}
    everything = np.concatenate(raw)
    for key, seen in (("MeanStdFilter", everything), ("MeanStdFilter#2", np.concatenate(demeaned))):
        stats = merged[key]["global"][0]
        assert stats["count"] == len(everything)
        np.testing.assert_allclose(stats["mean"], seen.mean(axis=0), rtol=1e-5, atol=1e-5)
    for server in servers:  # the merged state goes back with the weights
        server.set_state(merged)
        assert server.get_state()["MeanStdFilter#2"]["global"][0]["count"] == len(everything)


def _mean(state: dict) -> np.ndarray:
    """The mean the first filter used on its last call: its global and delta statistics together."""
    g, d = state["global"][0], state["delta"][0]
    return (g["mean"] * g["count"] + d["mean"] * d["count"]) / (g["count"] + d["count"])


def make_episode(id_: str, observations: list, space: gym.Space, numpy: bool = True) -> SingleAgentEpisode:
    """An episode (chunk) of these observations, without lookback: actions 0, rewards 0."""
    n = len(observations) - 1
    episode = SingleAgentEpisode(
        id_,
        observations=observations,
        actions=[0] * n,
        rewards=[0.0] * n,
        observation_space=space,
        action_space=ACTIONS,
        len_lookback_buffer=0,
    )
    return episode.to_numpy() if numpy else episode


def chunk(id_: str, n: int, start: float, numpy: bool = True) -> SingleAgentEpisode:
    """A chunk of `n` steps: observations [start], [start + 1], ..., [start + n]."""
    return make_episode(id_, [np.array([start + i], np.float32) for i in range(n + 1)], BOX, numpy)


def chunks() -> list[SingleAgentEpisode]:
    return [chunk("a", 2, 0.0), chunk("a", 3, 10.0), chunk("b", 1, 20.0), chunk("c_x", 1, 30.0), chunk("c_x", 2, 40.0)]


def column(batch: dict, name: str) -> dict:
    """Each key's values, its items concatenated (RLlib adds some columns as one item per step)."""
    return {key: np.concatenate([np.ravel(item) for item in items]).tolist() for key, items in batch[name].items()}


def test_add_one_ts_renames_every_episode_as_rllib_does():
    """RLlib: ids a, a, b, c_x, c_x become a_0, a_1, b_2, c_x_3, c_x_4; the loss mask per episode below;
    a second call on the same episode gives a_0_0."""
    episodes = chunks()
    batch = AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=episodes, shared_data={})
    assert [e.id_ for e in episodes] == ["a_0", "a_1", "b_2", "c_x_3", "c_x_4"]
    assert column(batch, Columns.LOSS_MASK) == {
        ("a_0",): [True, True, False],
        ("a_1",): [True, True, True, False],
        ("b_2",): [True, False],
        ("c_x_3",): [True, False],
        ("c_x_4",): [True, True, False],
    }
    again = [chunk("a", 2, 0.0)]
    for _ in range(2):
        AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=again, shared_data={})
    assert again[0].id_ == "a_0_0"


def test_learner_add_observations_renames_ids_without_an_underscore_as_rllib_does():
    """RLlib: a, a, b, c_x, c_x become a_0, a_1, b_2, c_x, c_x (an id holding "_" is left alone, so the two
    c_x chunks share one key); after AddOneTsToEpisodesAndTruncate it renames nothing."""
    episodes = chunks()
    piece = AddObservationsFromEpisodesToBatch(as_learner_connector=True)
    batch = piece(rl_module=None, batch={}, episodes=episodes)
    assert [e.id_ for e in episodes] == ["a_0", "a_1", "b_2", "c_x", "c_x"]
    assert column(batch, Columns.OBS) == {
        ("a_0",): [0.0, 1.0],
        ("a_1",): [10.0, 11.0, 12.0],
        ("b_2",): [20.0],
        ("c_x",): [30.0, 40.0, 41.0],
    }
    assert [len(items) for items in batch[Columns.OBS].values()] == [1, 1, 1, 2]

    episodes = chunks()
    batch = AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=episodes, shared_data={})
    batch = piece(rl_module=None, batch=batch, episodes=episodes)
    assert [e.id_ for e in episodes] == ["a_0", "a_1", "b_2", "c_x_3", "c_x_4"]
    assert column(batch, Columns.OBS) == {
        ("a_0",): [0.0, 1.0, 2.0],
        ("a_1",): [10.0, 11.0, 12.0, 13.0],
        ("b_2",): [20.0, 21.0],
        ("c_x_3",): [30.0, 31.0],
        ("c_x_4",): [40.0, 41.0, 42.0],
    }


def test_env_to_module_add_observations_refuses_numpy_episodes_as_rllib_does():
    """RLlib: list-mode episodes pass; numpy'd ones (alone or after a list-mode one) fail (a bare
    AssertionError; here a ValueError); with OBS already in the batch nothing is checked."""
    piece = AddObservationsFromEpisodesToBatch()
    listed = chunk("l", 1, 0.0, numpy=False)
    assert list(piece(rl_module=None, batch={}, episodes=[listed])[Columns.OBS]) == [("l",)]
    for episodes in ([chunk("n", 1, 0.0)], [chunk("l", 1, 0.0, numpy=False), chunk("n", 1, 0.0)]):
        batch: dict = {}
        with pytest.raises(ValueError, match="episode n is numpy'd"):
            piece(rl_module=None, batch=batch, episodes=episodes)
        assert batch == {}
    present = {Columns.OBS: np.zeros((1, 1), np.float32)}
    assert piece(rl_module=None, batch=present, episodes=[chunk("n", 1, 0.0)]) is present


def test_tensor_to_numpy_reduces_dtypes_as_rllib_does():
    """RLlib's output dtype (or Python type) for each input: floating -> float32, int64 -> int32, other
    integers, unsigned and bool kept, numpy arrays reduced too, a 0-d tensor a Python number."""
    batch = {
        "t_float16": torch.ones(2, dtype=torch.float16),
        "t_float32": torch.ones(2, dtype=torch.float32),
        "t_float64": torch.ones(2, dtype=torch.float64),
        "t_int8": torch.ones(2, dtype=torch.int8),
        "t_int16": torch.ones(2, dtype=torch.int16),
        "t_int32": torch.ones(2, dtype=torch.int32),
        "t_int64": torch.ones(2, dtype=torch.int64),
        "t_uint8": torch.ones(2, dtype=torch.uint8),
        "t_bool": torch.ones(2, dtype=torch.bool),
        "t_grad": torch.ones(2, requires_grad=True),
        "np_float16": np.ones(2, np.float16),
        "np_float64": np.ones(2, np.float64),
        "np_int32": np.ones(2, np.int32),
        "np_int64": np.ones(2, np.int64),
        "np_uint32": np.ones(2, np.uint32),
        "np_uint64": np.ones(2, np.uint64),
        "np_bool": np.ones(2, np.bool_),
        "np0_int64": np.array(3),
        "nested": {"a": torch.ones(2, dtype=torch.int64), "b": (torch.ones(2, dtype=torch.float64),)},
    }
    rllib = {
        "t_float16": "float32",
        "t_float32": "float32",
        "t_float64": "float32",
        "t_int8": "int8",
        "t_int16": "int16",
        "t_int32": "int32",
        "t_int64": "int32",
        "t_uint8": "uint8",
        "t_bool": "bool",
        "t_grad": "float32",
        "np_float16": "float32",
        "np_float64": "float32",
        "np_int32": "int32",
        "np_int64": "int32",
        "np_uint32": "uint32",
        "np_uint64": "uint64",
        "np_bool": "bool",
        "np0_int64": "int32",
    }
    out = TensorToNumpy()(rl_module=None, batch=batch, episodes=[])
    assert {key: out[key].dtype.name for key in rllib} == rllib
    assert out["np0_int64"].shape == ()
    assert out["nested"]["a"].dtype == np.int32 and out["nested"]["b"][0].dtype == np.float32
    scalars = TensorToNumpy()(
        rl_module=None, batch={"i": torch.tensor(3), "f": torch.tensor(1.5, dtype=torch.float64)}, episodes=[]
    )
    assert scalars == {"i": 3, "f": 1.5} and type(scalars["i"]) is int and type(scalars["f"]) is float


DICT_SPACE = gym.spaces.Dict(
    {
        "a": gym.spaces.Box(-10.0, 10.0, (), np.float32),
        "b": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2, 1), np.float32)]),
        "c": gym.spaces.MultiDiscrete([2, 3]),
    }
)
# Each observation and its flat row, as RLlib's FlattenObservations makes it (its env-to-module mode,
# and its learner mode for a one-step episode).
DICT_ROWS = [
    (
        {"c": np.array([0, 2]), "a": np.float32(-10.0), "b": (1, np.array([[-1.0], [-1.0]], np.float32))},
        [-10.0, 0.0, 1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    ),
    (
        {"c": np.array([1, 1]), "a": np.float32(3.0), "b": (0, np.array([[1.0], [0.5]], np.float32))},
        [3.0, 1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 1.0, 0.0],
    ),
    (
        {"c": np.array([1, 0]), "a": np.float32(7.0), "b": (1, np.array([[0.0], [-0.5]], np.float32))},
        [7.0, 0.0, 1.0, 0.0, -0.5, 0.0, 1.0, 1.0, 0.0, 0.0],
    ),
]


def dict_episode(id_: str, rows: list, numpy: bool) -> SingleAgentEpisode:
    return make_episode(id_, [obs for obs, _ in rows], DICT_SPACE, numpy)


@pytest.mark.parametrize("numpy", [False, True])
def test_flatten_observations_as_learner_connector_adds_every_flat_observation(numpy):
    """RLlib's learner mode adds OBS = the flat observations but the final one, per episode, and leaves the
    episodes alone; for a one-step episode its row is DICT_ROWS[0]'s. For longer episodes it flattens only
    the first observation (a 2-step Dict episode gives [2, 5] rows of DICT_ROWS[0]'s ten values) and on
    numpy'd Dict episodes it fails; here every observation gives its row (RLlib's env-to-module rows)."""
    one_step = dict_episode("o", DICT_ROWS[:2], numpy)
    two_steps = dict_episode("t", DICT_ROWS, numpy)
    episodes = [one_step, two_steps]
    piece = FlattenObservations(DICT_SPACE, ACTIONS, as_learner_connector=True)
    assert piece.observation_space == gym.spaces.Box(-np.inf, np.inf, (10,), np.float32)
    batch = piece(rl_module=None, batch={}, episodes=episodes)
    assert list(batch) == [Columns.OBS] and [e.id_ for e in episodes] == ["o_0", "t_1"]
    one = batch[Columns.OBS][("o_0",)]
    two = batch[Columns.OBS][("t_1",)]
    assert len(one) == len(two) == 1 and one[0].dtype == np.float32
    np.testing.assert_array_equal(one[0], [DICT_ROWS[0][1]])
    np.testing.assert_array_equal(two[0], [row for _, row in DICT_ROWS[:2]])
    assert isinstance(two_steps.get_observations(0), dict)  # the episodes keep their observations

    batch = AddObservationsFromEpisodesToBatch(as_learner_connector=True)(
        rl_module=None, batch=batch, episodes=episodes
    )
    flat = BatchIndividualItems()(rl_module=None, batch=batch, episodes=episodes, shared_data={})[Columns.OBS]
    assert flat.shape == (3, 10)


def test_flatten_observations_as_learner_connector_refuses_a_batch_with_obs():
    """RLlib's appends a second item per episode to an OBS already there (a [1, 2, 2] and a [1, 4] item
    under one key); here that is an error naming the fix."""
    episode = dict_episode("o", DICT_ROWS[:2], numpy=True)
    batch = AddObservationsFromEpisodesToBatch(as_learner_connector=True)(rl_module=None, batch={}, episodes=[episode])
    piece = FlattenObservations(DICT_SPACE, ACTIONS, as_learner_connector=True)
    with pytest.raises(ValueError, match="place it before the piece that adds OBS"):
        piece(rl_module=None, batch=batch, episodes=[episode])


def test_flatten_observations_as_learner_connector_on_box_and_discrete_spaces():
    """RLlib, one-step Box (2, 2) episode: [[0, 1, 2, 3]]; a Discrete(3) episode fails there (a reshape
    error); here one-hot rows."""
    box = gym.spaces.Box(-1.0, 99.0, (2, 2), np.float32)
    episode = make_episode("b", [np.arange(4, dtype=np.float32).reshape(2, 2) + 10 * i for i in range(3)], box)
    batch = FlattenObservations(box, ACTIONS, as_learner_connector=True)(rl_module=None, batch={}, episodes=[episode])
    np.testing.assert_array_equal(batch[Columns.OBS][("b_0",)][0], [[0, 1, 2, 3], [10, 11, 12, 13]])
    discrete = gym.spaces.Discrete(3)
    episode = make_episode("d", [0, 2, 1], discrete)
    piece = FlattenObservations(discrete, ACTIONS, as_learner_connector=True)
    batch = piece(rl_module=None, batch={}, episodes=[episode])
    np.testing.assert_array_equal(batch[Columns.OBS][("d_0",)][0], [[1, 0, 0], [0, 0, 1]])


def multi_agent_episodes() -> list[MultiAgentEpisode]:
    """Traces 0, 3 and 5: agents a0 a1 a2 (a0 on module p0, the others on p1), joining and leaving."""
    return [
        replay(MultiAgentEpisode(agent_to_module_mapping_fn=lambda a, e: "p0" if a == "a0" else "p1"), trace(seed))
        for seed in (0, 3, 5)
    ]


def test_add_one_ts_renames_multi_agent_episodes_as_rllib_does():
    """RLlib: each MultiAgentEpisode's id gets `_<its index>` and its agents' episodes take that id as
    multi_agent_episode_id (the first part of their batch key); the agents' own ids get `_<position>` over all
    agents' episodes (RLlib visits a MultiAgentEpisode's agents in set order, here in agent_episodes order)."""
    episodes = multi_agent_episodes()
    ids = [e.id_ for e in episodes]
    agent_ids = [{a: sa.id_ for a, sa in e.agent_episodes.items()} for e in episodes]
    batch = AddOneTsToEpisodesAndTruncate()(rl_module=None, batch={}, episodes=episodes, shared_data={})
    assert [e.id_ for e in episodes] == [f"{id_}_{i}" for i, id_ in enumerate(ids)]
    positions = iter(range(8))
    for e, before in zip(episodes, agent_ids, strict=True):
        for agent, sa in e.agent_episodes.items():
            assert (sa.id_, sa.multi_agent_episode_id) == (f"{before[agent]}_{next(positions)}", e.id_)
    keys = {(e.id_, a, "p0" if a == "a0" else "p1") for e in episodes for a in e.agent_episodes}
    assert set(batch[Columns.LOSS_MASK]) == keys


def test_learner_add_observations_renames_agents_episodes_only_as_rllib_does():
    """RLlib: the learner AddObservationsFromEpisodesToBatch gives the agents' episodes `_<position>` and
    leaves the MultiAgentEpisodes' ids (their agents' batch keys) alone. Agents' episodes given without their
    MultiAgentEpisode (rlgate's learner gets them so) also get `_<position>` on multi_agent_episode_id."""
    episodes = multi_agent_episodes()
    ids = [e.id_ for e in episodes]
    batch = AddObservationsFromEpisodesToBatch(as_learner_connector=True)(rl_module=None, batch={}, episodes=episodes)
    assert [e.id_ for e in episodes] == ids
    agents = [sa for e in episodes for sa in e.agent_episodes.values()]
    assert [sa.id_.rsplit("_", 1)[1] for sa in agents] == [str(i) for i in range(8)]
    assert {key[0] for key in batch[Columns.OBS]} == set(ids)

    bare = [sa for e in multi_agent_episodes() for sa in e.agent_episodes.values()]
    before = [sa.multi_agent_episode_id for sa in bare]
    AddObservationsFromEpisodesToBatch(as_learner_connector=True)(rl_module=None, batch={}, episodes=bare)
    assert [sa.multi_agent_episode_id for sa in bare] == [f"{id_}_{i}" for i, id_ in enumerate(before)]


class HalfObsValues:
    """A module whose value of an observation [x] is x / 2."""

    model_config: dict = {}

    def is_stateful(self) -> bool:
        return False

    def compute_values(self, batch: dict) -> torch.Tensor:
        return batch[Columns.OBS][:, 0] * 0.5


def test_gae_value_targets_as_rllib_and_advantages_standardised_over_the_real_steps():
    """RLlib's PPO learner pipeline (gamma 0.9, lambda 0.8) on three chunks (A terminated, B truncated with one
    lookback step, C unfinished): the value targets below, equal here. Its advantages are standardised over
    every row, the appended bootstrap rows included; here (documented in GeneralAdvantageEstimation) over the
    LOSS_MASK rows: standardised over every row, ours are RLlib's."""
    box = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    chunks = [
        ("A", [1, 2, 3, 4], [1.0, 0.0, 2.0], 0, True, False),
        ("B", [5, 6, 7, 8], [0.5, -1.0, 1.0], 1, False, True),
    ]
    chunks.append(("C", [2, 0, 4], [0.0, 3.0], 0, False, False))
    episodes = [
        SingleAgentEpisode(
            id_,
            observations=[np.array([o], np.float32) for o in obs],
            observation_space=box,
            actions=[0] * len(rewards),
            action_space=ACTIONS,
            rewards=rewards,
            len_lookback_buffer=lookback,
            t_started=lookback,
            terminated=terminated,
            truncated=truncated,
        )
        for id_, obs, rewards, lookback, terminated, truncated in chunks
    ]
    pipeline = build_learner_pipeline(box, ACTIONS, gae=(0.9, 0.8))
    batch = pipeline(rl_module=HalfObsValues(), batch={}, episodes=episodes, shared_data={})
    targets = [2.4112, 1.71, 2.0, 2.65824, 2.942, 4.6, 2.66832, 3.456, 4.8, 0.0]
    np.testing.assert_allclose(batch[Columns.VALUE_TARGETS].numpy(), targets, atol=1e-5)
    assert batch[Columns.LOSS_MASK].tolist() == [True, True, True, False, True, True, False, True, True, False]
    raw = batch[Columns.VALUE_TARGETS].numpy() - batch[Columns.OBS][:, 0].numpy() * 0.5
    rllib = [0.568494, -0.090255, -0.205421, -0.118641, -0.511433, 0.123625, -1.209931, 0.867268, 2.152739, -1.576444]
    np.testing.assert_allclose((raw - raw.mean()) / raw.std(), rllib, atol=1e-5)
    valid = batch[Columns.LOSS_MASK].numpy()
    expected = (raw - raw[valid].mean()) / raw[valid].std()
    np.testing.assert_allclose(batch[Columns.ADVANTAGES].numpy(), expected, atol=1e-5)


class CategoricalModule:
    def get_inference_action_dist_cls(self) -> type[Categorical]:
        return Categorical


def test_get_actions_when_not_exploring_writes_no_action_logp():
    """RLlib, explore=False on logits [[0.1, 2, -1], [3, 0, 0.5]]: ACTIONS [1, 0] and ACTION_LOGP tensor([0, 0])
    (int64, its deterministic distribution's zeros_like(actions)); here (documented in GetActions) no
    ACTION_LOGP."""
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    batch = GetActions()(rl_module=CategoricalModule(), batch={Columns.ACTION_DIST_INPUTS: logits}, episodes=[])
    assert batch[Columns.ACTIONS].tolist() == [1, 0] and Columns.ACTION_LOGP not in batch


def test_deterministic_distribution_gives_float_zeros_over_the_batch():
    """RLlib's TorchDeterministic of DiagGaussian logits [[0.5, -1, 0, 0.2]]: logp [[0., 0.]] (the mean's
    shape), entropy RuntimeError; here (documented in Deterministic) [0.] for both."""
    greedy = DiagGaussian.from_logits(torch.tensor([[0.5, -1.0, 0.0, 0.2]])).to_deterministic()
    assert greedy.logp(torch.tensor([[0.5, -1.0]])).tolist() == [0.0] == greedy.entropy().tolist()


def test_categorical_kl_stays_finite_where_the_other_gives_an_action_probability_0():
    """RLlib's TorchCategorical: KL(logits [0, 1, 2] || [0, -inf, 2]) == inf; here (documented in
    Categorical.kl) finite, and still far above any KL of possible actions."""
    kl = Categorical(torch.tensor([[0.0, 1.0, 2.0]])).kl(Categorical(torch.tensor([[0.0, -float("inf"), 2.0]])))
    assert torch.isfinite(kl).all() and kl.item() > 1e30


def test_unsquash_float16_and_int_boxes():
    """RLlib's unsquash_action: a float16 Box(-2, 2) leaves [0.5, -1] as they are (it unsquashes only float32
    and float64 Boxes); an int32 Box(1, 4) gives [0, 3] + 1 = [1, 4] as int64. Here (documented in
    unsquash_action) the float16 actions are unsquashed like any float Box's, and the int32 Box keeps int32."""
    half = unsquash_action(np.array([0.5, -1.0], np.float16), gym.spaces.Box(-2.0, 2.0, (2,), np.float16))
    assert half.dtype == np.float16 and half.tolist() == [1.0, -2.0]
    ints = unsquash_action(np.array([0, 3]), gym.spaces.Box(1, 4, (2,), np.int32))
    assert ints.dtype == np.int32 and ints.tolist() == [1, 4]


def test_prev_actions_prev_rewards_fit_their_space():
    """RLlib, n_prev_actions=2, n_prev_rewards=2, Discrete(3) actions: its space has prev_n_actions (6,) and
    prev_n_rewards (2,), float32; at the reset it gives [[0, 0, 0], [0, 0, 0]] and [0, 0]; after action 2 and
    reward 0.5, [[0, 0, 0], [0, 0, 1]] and [0, 0.5] as float64. Here (documented in PrevActionsPrevRewards) the
    same values in the space's shapes and dtype."""
    box = gym.spaces.Box(-50.0, 50.0, (3,), np.float32)
    actions = gym.spaces.Discrete(3)
    pipeline = ConnectorPipelineV2(
        box, actions, connectors=[PrevActionsPrevRewards(n_prev_actions=2, n_prev_rewards=2)]
    )
    space = pipeline.observation_space
    assert (space["prev_n_actions"].shape, space["prev_n_rewards"].shape) == ((6,), (2,))
    episode = SingleAgentEpisode(observation_space=box, action_space=actions)
    episode.add_env_reset(np.array([1.0, 2.0, 3.0], np.float32))
    pipeline(rl_module=None, batch={}, episodes=[episode])
    first = episode.get_observations(-1)
    assert first["prev_n_actions"].tolist() == [0.0] * 6 and first["prev_n_rewards"].tolist() == [0.0, 0.0]
    episode.add_env_step(np.array([3.0, 2.0, 0.0], np.float32), 2, 0.5)
    pipeline(rl_module=None, batch={}, episodes=[episode])
    latest = episode.get_observations(-1)
    assert latest["prev_n_actions"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert latest["prev_n_rewards"].tolist() == [0.0, 0.5]
    assert latest["prev_n_actions"].dtype == latest["prev_n_rewards"].dtype == np.float32


MSF_OBS = [np.array(o, np.float32) for o in ([1, 2, 3], [3, 2, 0], [5, -1, 1], [0, 0, 7])]


def test_mean_std_filter_normalises_one_episode_as_rllib():
    """RLlib's MeanStdFilter stepping one episode through MSF_OBS: the normalised observations below."""
    box = gym.spaces.Box(-50.0, 50.0, (3,), np.float32)
    pipeline = ConnectorPipelineV2(box, ACTIONS, connectors=[MeanStdFilter()])
    episode = SingleAgentEpisode(observation_space=box, action_space=ACTIONS)
    episode.add_env_reset(MSF_OBS[0])
    pipeline(rl_module=None, batch={}, episodes=[episode])
    seen = [episode.get_observations(-1)]
    for obs in MSF_OBS[1:]:
        episode.add_env_step(obs, 0, 0.0)
        pipeline(rl_module=None, batch={}, episodes=[episode])
        seen.append(episode.get_observations(-1))
    rllib = [[0.0, 0.0, 0.0], [0.707106, 0.0, -0.707106], [1.0, -1.1547, -0.218218], [-1.014722, -0.5, 1.372873]]
    np.testing.assert_allclose(seen, rllib, atol=1e-5)


def test_mean_std_filter_normalises_a_call_with_the_statistics_after_it():
    """RLlib on two episodes at once (resets MSF_OBS[0] and [1]) normalises one after the other: the first
    with the statistics of itself alone, [0, 0, 0], the second [0.707106, 0, -0.707106]. Here (documented in
    MeanStdFilter) both with the statistics after the whole call, so the order of the episodes does not matter."""
    box = gym.spaces.Box(-50.0, 50.0, (3,), np.float32)
    pipeline = ConnectorPipelineV2(box, ACTIONS, connectors=[MeanStdFilter()])
    episodes = [SingleAgentEpisode(observation_space=box, action_space=ACTIONS) for _ in range(2)]
    for episode, obs in zip(episodes, MSF_OBS, strict=False):
        episode.add_env_reset(obs)
    pipeline(rl_module=None, batch={}, episodes=episodes)
    seen = [e.get_observations(-1) for e in episodes]
    np.testing.assert_allclose(seen, [[-0.707106, 0.0, 0.707106], [0.707106, 0.0, -0.707106]], atol=1e-5)


# RLlib 2.60's FrameStacking(multi_agent=True, num_frames=3) on a turn-based MultiAgentEpisode (image-like frames
# [1, 2, 1] of [[v], [-v]], the only form RLlib's stacks): a observes at reset, b joins at env step 1, they take
# turns, and a is terminated at env step 5 without a last observation. Each stack flattened, per env step: the
# agents that stepped and their stacks; "t4 again" runs the piece a second time on the same episode.
RLLIB_MA_STACKS = {
    "reset": {"a": [0.0, 0.0, 1.0, 0.0, 0.0, -1.0]},
    "t1": {"b": [0.0, 0.0, 21.0, 0.0, 0.0, -21.0]},
    "t2": {"a": [0.0, 1.0, 2.0, 0.0, -1.0, -2.0]},
    "t3": {"b": [0.0, 21.0, 23.0, 0.0, -21.0, -23.0]},
    "t4": {"a": [1.0, 2.0, 4.0, -1.0, -2.0, -4.0]},
    "t4 again": {"a": [1.0, 2.0, 4.0, -1.0, -2.0, -4.0]},
    "t5": {"a": [2.0, 4.0, 4.0, -2.0, -4.0, -4.0], "b": [21.0, 23.0, 25.0, -21.0, -23.0, -25.0]},
}
# Its learner form (as_learner_connector=True) on the episode after t5, numpy'd: every step of each agent.
RLLIB_MA_LEARNER_STACKS = {
    "a": [[0.0, 0.0, 1.0, 0.0, 0.0, -1.0], [0.0, 1.0, 2.0, 0.0, -1.0, -2.0], [1.0, 2.0, 4.0, -1.0, -2.0, -4.0]],
    "b": [[0.0, 0.0, 21.0, 0.0, 0.0, -21.0], [0.0, 21.0, 23.0, 0.0, -21.0, -23.0]],
}


def test_multi_agent_frame_stacking_stacks_each_agents_frames_as_rllib_does():
    """RLlib 2.60's FrameStacking(multi_agent=True), both forms, on the episode of RLLIB_MA_STACKS. Its output
    spaces: Dict('a': Box(-100, 100, (1, 2, 3)), 'b': ...) by agent id, and by module id for a Dict of modules.
    (RLlib's constructor fails when given spaces, reading `_multi_agent` before setting it; rlgate's does not.)"""
    from rlgate.connectors.env_to_module import FrameStackingEnvToModule
    from rlgate.connectors.learner import FrameStackingLearner
    from rlgate.episodes import MultiAgentEpisode

    frame = gym.spaces.Box(-100.0, 100.0, (1, 2, 1), np.float32)
    stacked = gym.spaces.Box(-100.0, 100.0, (1, 2, 3), np.float32)
    agents = gym.spaces.Dict({"a": frame, "b": frame})
    piece = FrameStackingEnvToModule(
        agents, gym.spaces.Dict({"a": ACTIONS, "b": ACTIONS}), num_frames=3, multi_agent=True
    )
    assert piece.observation_space == gym.spaces.Dict({"a": stacked, "b": stacked})
    learner = FrameStackingLearner(gym.spaces.Dict({"p": frame}), None, num_frames=3, multi_agent=True)
    assert learner.observation_space == gym.spaces.Dict({"p": stacked})

    def o(v: float) -> np.ndarray:
        return np.array([[[v], [-v]]], np.float32)

    episode = MultiAgentEpisode(
        observation_space=agents, action_space=piece.input_action_space, agent_to_module_mapping_fn=lambda *_: "p"
    )
    episode.add_env_reset(observations={"a": o(1)})
    stacks = {}

    def show(tag: str) -> None:
        batch = piece(rl_module=None, batch={}, episodes=[episode])
        assert all(
            key[0] == episode.id_ and key[2] == "p" and len(items) == 1 for key, items in batch[Columns.OBS].items()
        )
        stacks[tag] = {key[1]: items[0].reshape(-1).tolist() for key, items in batch[Columns.OBS].items()}

    show("reset")
    episode.add_env_step({"b": o(21)}, {"a": 0}, {"a": 0.0})
    show("t1")
    episode.add_env_step({"a": o(2)}, {"b": 1}, {"b": 0.0})
    show("t2")
    episode.add_env_step({"b": o(23)}, {"a": 1}, {"a": 1.0})
    show("t3")
    episode.add_env_step({"a": o(4)}, {"b": 0}, {"b": 1.0})
    show("t4")
    show("t4 again")
    episode.add_env_step({"b": o(25)}, {"a": 0}, {"a": 5.0}, terminateds={"a": True, "__all__": False})
    show("t5")
    assert stacks == RLLIB_MA_STACKS

    agent_episodes = list(episode.to_numpy().agent_episodes.values())
    batch = learner(rl_module=None, batch={}, episodes=agent_episodes)
    assert {key[1]: [row.reshape(-1).tolist() for row in items[0]] for key, items in batch[Columns.OBS].items()} == (
        RLLIB_MA_LEARNER_STACKS
    )


class ModuleSpec:
    """What AgentToModuleMapping reads of RLlib's RLModuleSpec: its spaces (None where not given)."""

    def __init__(self, observation_space=None, action_space=None) -> None:
        self.observation_space, self.action_space = observation_space, action_space


B2, B3 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
D2, D3 = gym.spaces.Discrete(2), gym.spaces.Discrete(3)
AGENT_OBS = gym.spaces.Dict({"a0": B2, "a1": B3, "a2": B2})
AGENT_ACT = gym.spaces.Dict({"a0": D2, "a1": D3, "a2": D2})


def a1_alone(agent_id, episode):
    return "m1" if agent_id == "a1" else "m0"


@pytest.mark.parametrize(
    ("specs", "mapping", "spaces", "expected"),
    [
        ({"m0", "m1"}, a1_alone, (AGENT_OBS, AGENT_ACT), {"m0": (B2, D2), "m1": (B3, D3)}),
        (
            {"m0": ModuleSpec(B3, D3), "m1": ModuleSpec()},
            a1_alone,
            (AGENT_OBS, AGENT_ACT),
            {"m0": (B3, D3), "m1": (B3, D3)},
        ),
        (
            {"m0": ModuleSpec(B2), "m1": ModuleSpec(B3)},
            a1_alone,
            (AGENT_OBS, AGENT_ACT),
            {"m0": (B2, D2), "m1": (B3, D3)},
        ),
        (
            {"x", "y"},
            lambda agent_id, episode: "x",
            (gym.spaces.Dict({"a0": B2, "a1": B2}), gym.spaces.Dict({"a0": D2, "a1": D2})),
            {"x": (B2, D2), "y": (B2, D2)},
        ),
        ({"a0", "a1", "a2"}, a1_alone, (AGENT_OBS, AGENT_ACT), {a: (AGENT_OBS[a], AGENT_ACT[a]) for a in AGENT_OBS}),
    ],
    ids=["mapped", "spec-spaces", "spec-obs-only", "shared", "already-by-module"],
)
def test_agent_to_module_mapping_derives_module_spaces_as_rllib(specs, mapping, spaces, expected):
    """RLlib's output spaces, Dicts by module id: the module spec's space, else the agents' shared one (even for a
    module no agent maps to), else the space of the agents the function maps to the module; input spaces keyed by
    the module ids already stay. RLlib's own constructor cannot take input spaces with these arguments (it
    recomputes the output spaces before storing them: AttributeError), so RLlib set them afterwards; here both
    ways give the same."""
    late = AgentToModuleMapping(rl_module_specs=specs, agent_to_module_mapping_fn=mapping)
    late.input_observation_space, late.input_action_space = spaces
    for piece in (AgentToModuleMapping(*spaces, rl_module_specs=specs, agent_to_module_mapping_fn=mapping), late):
        assert piece.observation_space == gym.spaces.Dict({m: s[0] for m, s in expected.items()})
        assert piece.action_space == gym.spaces.Dict({m: s[1] for m, s in expected.items()})


@pytest.mark.parametrize(
    ("specs", "mapping", "message"),
    [
        ({"m0"}, lambda agent_id, episode: "m0", r"two agents \('a0' and 'a1'\) map to the same ModuleID 'm0'"),
        ({"m0", "m1", "m2"}, a1_alone, r"could not find or derive any observation space for RLModule 'm2'"),
    ],
)
def test_agent_to_module_mapping_refuses_spaces_it_cannot_derive_as_rllib(specs, mapping, message):
    """RLlib raises ValueError when agents of different spaces map to one module ("Two agents (a1 and a0) ...
    map to the same ModuleID") and when no agent maps to a module without spaces in its spec."""
    with pytest.raises(ValueError, match=message):
        AgentToModuleMapping(AGENT_OBS, AGENT_ACT, rl_module_specs=specs, agent_to_module_mapping_fn=mapping)
