"""Chunk: an episode chunk on its way to where it is kept (the learner, episode files), as columns with its spaces.

Sessions (a server's, and a local-inference client's: `episodes.session`) make them; shippers encode them as they
send or write them.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym

from rlgate.episodes.codec import ChunkColumns, episode_columns
from rlgate.episodes.single_agent_episode import SingleAgentEpisode

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
    if chunk.columns.terminated:
        return "terminated"
    return "truncated" if chunk.columns.truncated else "cut"
