"""The reference for `episodes.session.Session`: the same protocol kept as one SingleAgentEpisode per sub-env.

Every step goes through `add_env_reset` / `add_env_step` and every chunk through `cut`, exactly as an
RLlib env runner records episodes. The server's column-wise Session must ship the same episodes.

A step observed but not yet recorded (its actions still being computed) is pending: a flush then ships
each episode's steps before it (`slice`), and the rest becomes the next chunk at `record()`, once the
connectors have written the pending observations back into the episode objects they were given; a
close drops the pending step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgate.core.columns import RECORDED_OUTPUTS, Columns
from rlgate.core.tree import map_structure
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.session import SessionSpec


class ReferenceSession:
    """observe / record / flush / close with per-sub-env episode objects."""

    def __init__(self, spec: SessionSpec, *, rollout_fragment_length: int, lookback: int) -> None:
        self.spec = spec
        self.episodes: list[SingleAgentEpisode | None] = [None] * spec.num_envs
        self._outputs: dict[str, Any] | None = None
        self._fragment = rollout_fragment_length
        self._lookback = lookback
        self._pending = False
        self._flushed: list[int] = [0] * spec.num_envs  # steps of the episode a flush shipped while pending

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
        self._pending = True
        return current, steps

    def record(self, outputs: dict[str, Any]) -> list[SingleAgentEpisode]:
        self._outputs = outputs
        self._pending = False
        for i, shipped in enumerate(self._flushed):
            if shipped:  # what a flush left of the episode becomes its next chunk
                self.episodes[i] = self._rest(self.episodes[i], shipped)
        self._flushed = [0] * self.spec.num_envs
        return self._take_done() + self._cut(lambda episode: len(episode) >= self._fragment)

    def flush(self) -> list[SingleAgentEpisode]:
        if not self._pending:
            return self._take_done() + self._cut(lambda episode: len(episode) > 0)
        chunks = []
        for i, episode in enumerate(self.episodes):
            recorded = len(episode) - 1 if episode is not None else 0  # the last step is the pending one
            if recorded > self._flushed[i]:
                chunks.append(episode[self._flushed[i] : recorded])
                self._flushed[i] = recorded
        return chunks

    def close(self) -> list[SingleAgentEpisode]:
        done = [] if self._pending else self._take_done()
        unfinished = []
        for i, episode in enumerate(self.episodes):
            if episode is None:
                continue
            start, stop = self._flushed[i], len(episode) - 1 if self._pending else len(episode)
            if stop > start:
                chunk = self._rest(episode, start)[: stop - start] if start else episode[:stop]
                chunk.is_truncated = chunk.session_closed = True
                unfinished.append(chunk)
        self.episodes = [None] * self.spec.num_envs
        return done + unfinished

    def _rest(self, episode: SingleAgentEpisode, shipped: int) -> SingleAgentEpisode:
        """The episode's steps after the first `shipped`, as the chunk that follows them (as `cut` makes it)."""
        rest = episode.slice(slice(shipped, None), len_lookback_buffer=self._lookback)
        rest.chunk_index = episode.chunk_index + 1
        return rest

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
