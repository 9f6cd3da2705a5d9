"""Shipped chunks (`rlgate.server.shipping.Chunk`) decoded back into episodes, as the learner decodes them."""

from __future__ import annotations

from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.codec import episode_from_proto
from rlgate.server.shipping import Chunk


def decoded(chunks: list[Chunk]) -> list[SingleAgentEpisode]:
    """The chunks' episodes, in their own spaces; each chunk's `steps` must be its episode's length."""
    episodes = [episode_from_proto(c.message, c.observation_space, c.action_space) for c in chunks]
    assert [len(e) for e in episodes] == [c.steps for c in chunks], "a chunk's steps are not its episode's length"
    return episodes
