"""Chunk: an episode chunk on its way to where it is kept (the learner, episode files), as columns with its spaces.

Sessions (a server's, and a local-inference client's: `episodes.session`) make them; shippers encode them as they
send or write them.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym

from rlgate.episodes.chunk_codec import ChunkColumns, episode_columns, episodes_from_chunks
from rlgate.episodes.single_agent_episode import SingleAgentEpisode
from rlgate.v1 import learner_pb2

#: How a shipped chunk can end (`episode_end`): the `end` label of the rlgate_episodes counter.
EPISODE_ENDS = ("terminated", "truncated", "cut")


class Chunk(NamedTuple):
    """An episode chunk to ship: its columns and the spaces of its data."""

    columns: ChunkColumns
    observation_space: gym.Space | None
    action_space: gym.Space | None

    @property
    def steps(self) -> int:
        """Its env steps (agent steps, for an agent's chunk), lookback excluded."""
        return self.columns.steps


def encoded(episodes: list[SingleAgentEpisode]) -> list[Chunk]:
    """Episodes built as objects (a multi-agent session's agents' chunks) as chunks to ship."""
    return [Chunk(episode_columns(episode), episode.observation_space, episode.action_space) for episode in episodes]


def episode_end(chunk: Chunk) -> str:
    """How a chunk ended, for metrics and logs: terminated, truncated or cut (the episode goes on)."""
    return ending(chunk.columns.terminated, chunk.columns.truncated)


def ending(terminated: bool, truncated: bool) -> str:
    """The EPISODE_ENDS name of a chunk with these flags."""
    if terminated:
        return "terminated"
    return "truncated" if truncated else "cut"


def batch_chunks(
    batch: learner_pb2.EpisodeBatch, observation_space: gym.Space | None, action_space: gym.Space | None
) -> list[Chunk]:
    """The chunks of a batch's EpisodeChunks tables, decoded in these spaces (a local-inference client's, which its
    server writes to its episode files). CodecError for a table that does not decode."""
    return [
        chunk
        for table in batch.chunks
        for chunk in encoded(episodes_from_chunks(table, observation_space, action_space))
    ]
