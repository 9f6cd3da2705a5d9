"""Shipped chunks (`rlgate.episodes.chunk.Chunk`) decoded back into episodes, as the learner decodes them."""

from __future__ import annotations

from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.chunk_codec import chunk_message, chunk_tables, episode_from_proto, episodes_from_chunks
from rlgate.v1 import episode_pb2
from support.episodes import assert_episodes_equal

# Beyond the columns.
TRAVELLING = (
    "agent_id",
    "module_id",
    "multi_agent_episode_id",
    "multi_agent_env_steps",
    "multi_agent_episode_chunks",
    "session_closed",
)


def decoded(chunks: list[Chunk]) -> list[SingleAgentEpisode]:
    """The chunks' episodes, in their own spaces, from their `Episode` messages (what episode files hold).

    Also decodes them from their `EpisodeChunks` tables (what a learner gets) and checks both give the same
    episodes; and that each chunk's `steps` is its episode's length.
    """
    episodes = [episode_from_proto(chunk_message(c.columns), c.observation_space, c.action_space) for c in chunks]
    assert [len(e) for e in episodes] == [c.steps for c in chunks], "a chunk's steps are not its episode's length"
    by_key = {(e.id_, e.chunk_index): e for e in episodes}
    spaces = {c.columns.layout(): (c.observation_space, c.action_space) for c in chunks}
    tables = chunk_tables([c.columns for c in chunks])
    for table, table_spaces in zip(tables, spaces.values(), strict=True):  # both in first-seen order
        wire = episode_pb2.EpisodeChunks.FromString(table.SerializeToString())
        for episode in episodes_from_chunks(wire, *table_spaces):
            expected = by_key.pop((episode.id_, episode.chunk_index))
            assert_episodes_equal(episode, expected)
            assert [getattr(episode, f) for f in TRAVELLING] == [getattr(expected, f) for f in TRAVELLING]
    assert not by_key, "chunks missing from the tables"
    return episodes
