"""The reference for `server.session.Session`: the same protocol kept as one SingleAgentEpisode per sub-env.

Every step goes through `add_env_reset` / `add_env_step` and every chunk through `cut`, exactly as an
RLlib env runner records episodes. The server's column-wise Session must ship the same episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.columns import Columns
from episodes import SingleAgentEpisode
from episodes.tree import map_structure
from server.session import RECORDED_OUTPUTS, SessionSpec


class ReferenceSession:
    """observe / record / flush / close with per-sub-env episode objects."""

    def __init__(self, spec: SessionSpec, *, rollout_fragment_length: int, lookback: int) -> None:
        self.spec = spec
        self.episodes: list[SingleAgentEpisode | None] = [None] * spec.num_envs
        self._outputs: dict[str, Any] | None = None
        self._fragment = rollout_fragment_length
        self._lookback = lookback

    def observe(self, obs: Any, rewards: Any, terminateds: Any, truncateds: Any, infos: Any) -> tuple[list, int]:
        current, steps = [], 0
        for i, episode in enumerate(self.episodes):
            row_obs = map_structure(lambda x, i=i: x[i], obs)
            info = infos[i] if infos else {}
            if episode is None or episode.is_done:
                episode = SingleAgentEpisode(
                    observation_space=self.spec.observation_space, action_space=self.spec.action_space
                )
                self.episodes[i] = episode
                episode.add_env_reset(observation=row_obs, infos=info)
            else:
                outputs = self._outputs
                assert outputs is not None
                episode.add_env_step(
                    observation=row_obs,
                    action=map_structure(lambda x, i=i: x[i], outputs[Columns.ACTIONS]),
                    reward=float(rewards[i]),
                    infos=info,
                    terminated=bool(terminateds[i]),
                    truncated=bool(truncateds[i]),
                    extra_model_outputs={
                        k: map_structure(lambda x, i=i: x[i], outputs[k]) for k in RECORDED_OUTPUTS if k in outputs
                    },
                )
                steps += 1
            current.append(episode)
        return current, steps

    def record(self, outputs: dict[str, Any]) -> list[SingleAgentEpisode]:
        self._outputs = outputs
        return self._take_done() + self._cut(lambda episode: len(episode) >= self._fragment)

    def flush(self) -> list[SingleAgentEpisode]:
        return self._take_done() + self._cut(lambda episode: len(episode) > 0)

    def close(self) -> list[SingleAgentEpisode]:
        done = self._take_done()
        unfinished = []
        for episode in self.episodes:
            if episode is not None and len(episode) > 0:
                episode.is_truncated = True
                unfinished.append(episode)
        self.episodes = [None] * self.spec.num_envs
        return done + unfinished

    def _take_done(self) -> list[SingleAgentEpisode]:
        done = []
        for i, episode in enumerate(self.episodes):
            if episode is not None and episode.is_done:
                done.append(episode)
                self.episodes[i] = None
        return done

    def _cut(self, due: Callable[[SingleAgentEpisode], bool]) -> list[SingleAgentEpisode]:
        chunks = []
        for i, episode in enumerate(self.episodes):
            if episode is not None and due(episode):
                chunks.append(episode)
                self.episodes[i] = episode.cut(len_lookback_buffer=self._lookback)
        return chunks
