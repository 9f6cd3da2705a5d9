"""Multi-agent episodes' returns as RLlib 2.60 reports them, summed from their agents' chunks.

RLlib's MultiAgentEnvRunner logs, once per multi-agent episode when it ends: `episode_return_mean` over the
SUM of all its agents' rewards, `episode_len_mean` over its env steps, `module_episode_returns_mean/<module>`
over the sum of the rewards of the agents mapped to that module in it, and `agent_episode_returns_mean/<agent>`
per agent. The learner gets only the agents' chunks, in any order, an agent that left early shipped earlier;
each chunk shipped when its multi-agent episode ended says how many agent chunks that episode shipped in all
(`multi_agent_episode_chunks`), so the episode is counted once every one of them has arrived, exactly once.

An episode cut off because its session ended (its chunks `session_closed`: the client left) did not finish, and
is not counted (RLlib counts no episode its env runner did not finish). Nor is one some of whose chunks never come
(a partial sum is never reported): the learner restarted between its chunks (those trained before it are not
re-read), a chunk was refused, its server predates `multi_agent_episode_chunks`, or its client left right after a
cut (the truncated rest has no steps, so nothing ships to say it ended). Its sums are
kept at most until `max_open` episodes that received a chunk since are open.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from rlgate.episodes import SingleAgentEpisode

log = logging.getLogger(__name__)

# Multi-agent episodes with chunks in and some to come, at most (each a few small dicts): far more than the
# sub-envs a learner's servers run at once.
MAX_OPEN = 10_000


@dataclass(frozen=True)
class EpisodeReturns:
    """One whole multi-agent episode: its return (every agent's rewards), env steps, and returns per module
    (its agents mapped to that module, summed) and per agent."""

    episode_return: float
    env_steps: int
    module_returns: dict[str, float]
    agent_returns: dict[str, float]


@dataclass
class _Open:
    """What arrived of one multi-agent episode."""

    chunks: int = 0
    expected: int = 0  # agent chunks the episode shipped in all; 0 until a chunk of its end says
    session_closed: bool = False  # cut off when its session ended, not by the env: whole, but not finished
    env_steps: int = 0
    module_returns: dict[str, float] = field(default_factory=dict)
    agent_returns: dict[str, float] = field(default_factory=dict)


class MultiAgentReturns:
    """Multi-agent episodes with some chunks in, counted as each becomes whole."""

    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self.max_open = max_open
        self.open: OrderedDict[str, _Open] = OrderedDict()  # by episode id, least recently added to first

    def add(self, chunk: SingleAgentEpisode) -> EpisodeReturns | None:
        """Count an agent's chunk (each only once: the intake drops re-delivered ones); its multi-agent episode's
        figures if this chunk made it whole (and its env, not its session's end, ended it), else None."""
        episode_id = chunk.multi_agent_episode_id
        assert episode_id is not None and chunk.module_id is not None  # an agent's chunk names both
        episode = self.open.pop(episode_id, None) or _Open()
        reward = chunk.get_return()
        episode.chunks += 1
        episode.expected = max(episode.expected, chunk.multi_agent_episode_chunks)
        episode.session_closed |= chunk.session_closed
        episode.env_steps += chunk.multi_agent_env_steps
        episode.module_returns[chunk.module_id] = episode.module_returns.get(chunk.module_id, 0.0) + reward
        episode.agent_returns[chunk.agent_id] = episode.agent_returns.get(chunk.agent_id, 0.0) + reward
        if episode.expected and episode.chunks >= episode.expected:
            if episode.session_closed:
                return None
            return EpisodeReturns(
                sum(episode.agent_returns.values()), episode.env_steps, episode.module_returns, episode.agent_returns
            )
        self.open[episode_id] = episode
        while len(self.open) > self.max_open:
            lost, _ = self.open.popitem(last=False)
            log.info(
                "multi-agent episode %s not counted: %d open episodes had chunks since its last", lost, self.max_open
            )
        return None
