"""The episode wire codec: round trips (lookback, nested spaces, extras, model versions, infos) and errors, of
one chunk per message and of many in EpisodeChunks tables."""

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlgate.core.codec import CodecError, to_tensor, to_value
from rlgate.core.columns import Columns
from rlgate.episodes import InfiniteLookbackBuffer, SingleAgentEpisode
from rlgate.episodes.chunk_codec import (
    chunk_tables,
    episode_columns,
    episode_from_proto,
    episode_to_proto,
    episodes_from_chunks,
)
from rlgate.v1 import episode_pb2

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


def wire(episode: SingleAgentEpisode, *spaces: gym.Space) -> SingleAgentEpisode:
    """Encode, serialize, parse and decode, as a server and a learner would."""
    data = episode_to_proto(episode).SerializeToString()
    return episode_from_proto(episode_pb2.Episode.FromString(data), *spaces)


def build(observation_space, action_space, steps, *, seed=0, infos=False, versions=True, done=None, lookback=0):
    """An episode of `steps` steps after `lookback` earlier steps taken by cut(), with 3 extra outputs."""
    observation_space.seed(seed)
    action_space.seed(seed + 1)
    rng = np.random.default_rng(seed)
    episode = SingleAgentEpisode(observation_space=observation_space, action_space=action_space, agent_id="a0")
    episode.add_env_reset(observation_space.sample(), {"reset": 1.0} if infos else None)
    for t in range(lookback + steps):
        if t == lookback and lookback:
            episode = episode.cut(len_lookback_buffer=lookback)
        outputs = {
            Columns.ACTION_LOGP: np.float32(rng.standard_normal()),
            Columns.ACTION_DIST_INPUTS: rng.standard_normal(3).astype(np.float32),
            Columns.VF_PREDS: np.float32(rng.standard_normal()),
        }
        if versions:
            outputs[Columns.MODEL_VERSION] = 7 + t // 3
        last = t == lookback + steps - 1
        episode.add_env_step(
            observation_space.sample(),
            action_space.sample(),
            float(rng.standard_normal()),
            {"t": float(t)} if infos else None,
            terminated=last and done == "terminated",
            truncated=last and done == "truncated",
            extra_model_outputs=outputs,
        )
    return episode


def test_round_trip_list_mode_episode(assert_episodes_equal):
    episode = build(BOX, DISCRETE, 20, done="terminated")
    decoded = wire(episode, BOX, DISCRETE)
    assert decoded.is_numpy and decoded.observation_space == BOX and decoded.action_space == DISCRETE
    assert decoded.agent_id == "a0" and decoded.module_id is None and decoded.multi_agent_episode_id is None
    assert_episodes_equal(decoded, episode)
    assert decoded.get_return() == pytest.approx(episode.get_return())


def test_round_trip_numpy_mode_with_lookback(assert_episodes_equal):
    episode = build(BOX, DISCRETE, 6, lookback=4).to_numpy()
    assert episode.chunk_index == 1 and episode.t_started == 4
    decoded = wire(episode)
    assert_episodes_equal(decoded, episode)
    np.testing.assert_array_equal(
        decoded.get_observations(slice(-4, 0), neg_index_as_lookback=True),
        episode.get_observations(slice(-4, 0), neg_index_as_lookback=True),
    )
    assert decoded.chunk_index == 1


def test_model_versions_travel_in_their_own_field():
    episode = build(BOX, DISCRETE, 5)
    msg = episode_to_proto(episode)
    assert msg.HasField("model_versions") and Columns.MODEL_VERSION not in msg.extra_model_outputs
    assert sorted(msg.extra_model_outputs) == sorted(
        [Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS]
    )
    versions = wire(episode).get_extra_model_outputs(Columns.MODEL_VERSION)
    assert versions.dtype == np.int64 and versions.tolist() == [7, 7, 7, 8, 8]
    without = build(BOX, DISCRETE, 5, versions=False)
    assert not episode_to_proto(without).HasField("model_versions")
    assert Columns.MODEL_VERSION not in wire(without).extra_model_outputs


def test_infos_travel_only_when_present():
    plain = build(BOX, DISCRETE, 3)
    assert len(episode_to_proto(plain).infos) == 0
    infos = wire(plain).get_infos()
    assert infos == [{}, {}, {}, {}] and len({id(info) for info in infos}) == 4  # distinct dicts
    with_infos = build(BOX, DISCRETE, 3, infos=True)
    assert wire(with_infos).get_infos() == [{"reset": 1.0}, {"t": 0.0}, {"t": 1.0}, {"t": 2.0}]


def test_empty_and_reset_only_episodes_round_trip(assert_episodes_equal):
    empty = SingleAgentEpisode(observation_space=BOX)
    decoded = wire(empty, BOX)
    assert len(decoded) == 0 and not decoded.is_reset and decoded.id_ == empty.id_
    reset_only = SingleAgentEpisode()
    reset_only.add_env_reset(np.zeros(4, np.float32))
    assert_episodes_equal(wire(reset_only), reset_only)


def test_decoded_episode_keeps_growing_and_can_be_set():
    episode = wire(build(BOX, DISCRETE, 4), BOX, DISCRETE)
    episode.set_rewards(new_data=0.0, at_indices=0)  # the wire arrays are read-only: set copies first
    episode.add_env_step(
        np.zeros(4, np.float32),
        1,
        1.0,
        extra_model_outputs={
            Columns.ACTION_LOGP: np.float32(0),
            Columns.ACTION_DIST_INPUTS: np.zeros(3, np.float32),
            Columns.VF_PREDS: np.float32(0),
            Columns.MODEL_VERSION: 9,
        },
    )
    episode.validate()
    assert len(episode) == 5 and episode.get_rewards(0) == 0.0
    assert episode.get_extra_model_outputs(Columns.MODEL_VERSION, -1) == 9
    assert episode.get_actions(-1, one_hot_discrete=True).tolist() == [0.0, 1.0]


def test_uneven_lookbacks_cannot_be_encoded():
    episode = build(BOX, DISCRETE, 3)
    episode.extra_model_outputs["late"] = InfiniteLookbackBuffer([0.0, 1.0, 2.0, 3.0], lookback=1)
    with pytest.raises(ValueError, match="lookback"):
        episode_to_proto(episode)


def corrupt(field: str, value) -> episode_pb2.Episode:
    msg = episode_to_proto(build(BOX, DISCRETE, 3, infos=True))
    if field == "infos":
        del msg.infos[-1]
    elif field == "len_lookback_buffer":
        msg.len_lookback_buffer = value
    else:
        getattr(msg, field).CopyFrom(value)
    return msg


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rewards", to_tensor(np.zeros((3, 2))), "rewards"),
        ("actions", to_value(np.zeros(2, np.int64)), "actions"),
        ("observations", to_value({"a": np.zeros(4), "b": np.zeros(3)}), "observations"),
        ("observations", to_value(np.float32(0.0)), "observations"),
        ("len_lookback_buffer", 5, "len_lookback_buffer"),
        ("infos", None, "infos"),
        ("model_versions", to_tensor(np.zeros(2, np.int64)), "model_version"),
    ],
)
def test_inconsistent_messages_raise_codec_error(field, value, message):
    with pytest.raises(CodecError, match=message):
        episode_from_proto(corrupt(field, value))


def test_bad_tensor_bytes_raise_codec_error():
    msg = episode_to_proto(build(BOX, DISCRETE, 3))
    msg.rewards.data = msg.rewards.data[:-1]
    with pytest.raises(CodecError, match="rewards"):
        episode_from_proto(msg)


# --- property-based round trips ---------------------------------------------------------------------------

leaf_spaces = st.one_of(
    st.integers(1, 3).map(lambda k: gym.spaces.Box(-1.0, 1.0, (k,), np.float32)),
    st.just(gym.spaces.Box(0, 255, (2, 2), np.uint8)),
    st.integers(2, 5).map(gym.spaces.Discrete),
    st.lists(st.integers(2, 4), min_size=1, max_size=3).map(gym.spaces.MultiDiscrete),
)
spaces = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(gym.spaces.Tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, min_size=1, max_size=3).map(gym.spaces.Dict),
    ),
    max_leaves=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    observation_space=spaces,
    action_space=spaces,
    steps=st.integers(0, 25),
    lookback=st.integers(0, 6),
    numpy_mode=st.booleans(),
    infos=st.booleans(),
    versions=st.booleans(),
    done=st.sampled_from([None, "terminated", "truncated"]),
    seed=st.integers(0, 2**16),
)
def test_round_trip_property(
    assert_episodes_equal, observation_space, action_space, steps, lookback, numpy_mode, infos, versions, done, seed
):
    if steps == 0:
        done = None  # a done flag needs a step
    episode = build(
        observation_space, action_space, steps, seed=seed, infos=infos, versions=versions, done=done, lookback=lookback
    )
    if numpy_mode:
        episode.to_numpy()
    decoded = wire(episode, observation_space, action_space)
    assert_episodes_equal(decoded, episode)
    assert decoded.observation_space == observation_space and decoded.is_numpy
    # Re-encoding the decoded episode gives the same bytes.
    assert episode_to_proto(decoded).SerializeToString(deterministic=True) == episode_to_proto(
        episode
    ).SerializeToString(deterministic=True)


def test_dict_data_comes_back_in_the_space_key_order():
    space = gym.spaces.Dict(
        {"z": gym.spaces.Discrete(2), "a": BOX, "m": gym.spaces.Tuple([gym.spaces.Dict({"y": BOX, "b": BOX})])}
    )
    decoded = wire(build(space, space, 3), space, space)
    for data in (decoded.get_observations(), decoded.get_actions(-1)):
        assert list(data) == list(space.spaces)
        assert list(data["m"][0]) == list(space["m"][0].spaces)


# --- EpisodeChunks tables ---------------------------------------------------------------------------------


def wire_tables(episodes: list[SingleAgentEpisode], *spaces: gym.Space) -> list[SingleAgentEpisode]:
    """Encode as tables, serialize, parse and decode, as a server's learner link and a learner would."""
    tables = [
        episode_pb2.EpisodeChunks.FromString(t.SerializeToString())
        for t in chunk_tables([episode_columns(e) for e in episodes])
    ]
    return [episode for table in tables for episode in episodes_from_chunks(table, *spaces)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    observation_space=spaces,
    action_space=spaces,
    chunks=st.lists(
        st.tuples(
            st.integers(0, 12), st.integers(0, 3), st.booleans(), st.sampled_from([None, "terminated", "truncated"])
        ),
        min_size=1,
        max_size=4,
    ),
    versions=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tables_round_trip_property(assert_episodes_equal, observation_space, action_space, chunks, versions, seed):
    """Chunks of any spaces, lengths, lookbacks, flags and infos (some with, some without) come out of one
    table as each would out of its own message."""
    episodes = [
        build(
            observation_space,
            action_space,
            steps,
            seed=seed + i,
            infos=infos,
            versions=versions,
            done=done if steps else None,
            lookback=lookback,
        )
        for i, (steps, lookback, infos, done) in enumerate(chunks)
    ]
    decoded = {e.id_: e for e in wire_tables(episodes, observation_space, action_space)}  # one table per layout
    assert len(decoded) == len(episodes)
    for episode in episodes:
        table_episode = decoded[episode.id_]
        assert_episodes_equal(table_episode, episode)
        assert_episodes_equal(table_episode, wire(episode, observation_space, action_space))
        assert table_episode.observation_space == observation_space and table_episode.is_numpy


def test_multi_agent_chunks_keep_their_agent_fields_one_table_per_module(assert_episodes_equal):
    episodes = []
    for i, (agent, module) in enumerate([("a0", "m0"), ("a1", "m1"), ("a2", "m0")]):
        episode = build(BOX, DISCRETE, 4 + i, seed=i)
        episode.agent_id, episode.module_id, episode.multi_agent_episode_id = agent, module, "game-1"
        episode.multi_agent_env_steps = 9 if i == 0 else 0
        episode.multi_agent_episode_chunks = 5
        episodes.append(episode)
    tables = chunk_tables([episode_columns(e) for e in episodes])
    assert [(t.module_id, list(t.agent_ids)) for t in tables] == [("m0", ["a0", "a2"]), ("m1", ["a1"])]
    decoded = {e.agent_id: e for t in tables for e in episodes_from_chunks(t, BOX, DISCRETE)}
    for episode in episodes:
        got = decoded[episode.agent_id]
        assert_episodes_equal(got, episode)
        fields = ("module_id", "multi_agent_episode_id", "multi_agent_env_steps", "multi_agent_episode_chunks")
        assert [getattr(got, f) for f in fields] == [getattr(episode, f) for f in fields]
        single = episode_from_proto(episode_to_proto(episode), BOX, DISCRETE)  # the same as one Episode message
        assert [getattr(single, f) for f in fields] == [getattr(episode, f) for f in fields]
    for table in tables:  # as a server that predates multi_agent_episode_chunks sends them: 0, not refused
        del table.multi_agent_episode_chunks[:]
        assert [e.multi_agent_episode_chunks for e in episodes_from_chunks(table, BOX, DISCRETE)] == [0] * len(
            table.ids
        )


def test_a_chunk_cut_off_as_its_session_closed_says_so_in_a_message_and_in_a_table():
    """`session_closed` travels (as the done flags do), and a table of chunks none of which has it carries no list."""
    closed, ended = build(BOX, DISCRETE, 4, seed=1, done="truncated"), build(BOX, DISCRETE, 3, seed=2, done="truncated")
    closed.session_closed = True
    assert episode_from_proto(episode_to_proto(closed), BOX, DISCRETE).session_closed
    assert not episode_from_proto(episode_to_proto(ended), BOX, DISCRETE).session_closed
    (table,) = chunk_tables([episode_columns(e) for e in (ended, closed)])
    assert list(table.session_closed) == [False, True]
    assert [e.session_closed for e in episodes_from_chunks(table, BOX, DISCRETE)] == [False, True]
    (table,) = chunk_tables([episode_columns(ended)])
    assert not table.session_closed and not episodes_from_chunks(table, BOX, DISCRETE)[0].session_closed


def test_chunks_of_different_shapes_or_outputs_go_into_separate_tables():
    wide = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    episodes = [build(BOX, DISCRETE, 3), build(wide, DISCRETE, 3), build(BOX, DISCRETE, 3, versions=False)]
    episodes.append(build(BOX, DISCRETE, 2, seed=4))
    assert [len(t.ids) for t in chunk_tables([episode_columns(e) for e in episodes])] == [2, 1, 1]


def test_an_empty_table_holds_no_chunks():
    assert episodes_from_chunks(episode_pb2.EpisodeChunks()) == []


def two_chunk_table() -> episode_pb2.EpisodeChunks:
    (table,) = chunk_tables([episode_columns(build(BOX, DISCRETE, n, seed=n, lookback=1)) for n in (3, 5)])
    return table


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.ids.append("x"), "chunk_indices: 2 entries for 3 chunks"),
        (lambda t: t.terminated.pop(), "terminated: 1 entries for 2 chunks"),
        (lambda t: t.agent_ids.pop(), "agent_ids: 1 entries for 2 chunks"),
        (lambda t: t.multi_agent_episode_chunks.pop(), "multi_agent_episode_chunks: 1 entries for 2 chunks"),
        (lambda t: t.session_closed.append(True), "session_closed: 1 entries for 2 chunks"),
        (lambda t: t.steps.__setitem__(1, 6), "rewards: 10 rows, .* make 11"),
        (lambda t: t.len_lookback_buffers.__setitem__(0, 0), "rewards: 10 rows, .* make 9"),
        (lambda t: t.actions.CopyFrom(to_value(np.zeros(9, np.int64))), "actions: 9 rows, .* make 10"),
        (lambda t: t.observations.CopyFrom(to_value(np.zeros((11, 4), np.float32))), "observations: 11 rows"),
        (lambda t: t.model_versions.CopyFrom(to_tensor(np.zeros(3, np.int64))), "extra_model_outputs.*model_version"),
        (lambda t: t.infos.add(), "infos: 1 for 12 observations"),
        (lambda t: t.rewards.CopyFrom(to_tensor(np.zeros((10, 2), np.float32))), "not one reward per step"),
        (lambda t: t.ClearField("observations"), "observations: missing value"),
    ],
)
def test_a_table_whose_rows_do_not_add_up_raises_codec_error(change, message):
    table = two_chunk_table()
    assert [len(e) for e in episodes_from_chunks(table, BOX, DISCRETE)] == [3, 5]
    change(table)
    with pytest.raises(CodecError, match=message):
        episodes_from_chunks(table, BOX, DISCRETE)
