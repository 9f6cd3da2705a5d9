"""EpisodeBatch messages of chunks: as servers send them (EpisodeChunks tables), or one message per chunk."""

from __future__ import annotations

from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import chunk_tables, episode_columns, episode_to_proto
from rlgate.v1 import learner_pb2


def episode_batch(chunks: list[SingleAgentEpisode], seq: int = 1, *, tables: bool = True) -> learner_pb2.EpisodeBatch:
    """A batch from server "test"; `tables=False`: in `episodes`, as servers wrote them before `chunks`."""
    if not tables:
        return learner_pb2.EpisodeBatch(seq=seq, server_id="test", episodes=[episode_to_proto(c) for c in chunks])
    columns = [episode_columns(chunk) for chunk in chunks]
    return learner_pb2.EpisodeBatch(seq=seq, server_id="test", chunks=chunk_tables(columns))
