"""One client stream: N sub-env episodes, fed one step message at a time.

A step message carries, for every sub-env, the observation that followed the previous action (or a
reset observation for a sub-env whose episode had ended, as gymnasium's NEXT_STEP autoreset does).
`observe` appends it to the sub-env's episode (O(1) per sub-env), the batcher computes actions for
all rows, and `record` keeps those actions and extra model outputs until the next observation
arrives, when `add_env_step` writes them into the episode exactly as RLlib episodes record them.
Episodes that ended, and long ones cut every `rollout_fragment_length` steps, come out of `record`
(after the forward, so connector write-backs such as MeanStdFilter's are in them) for shipping.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from connectors.columns import Columns
from episodes import SingleAgentEpisode
from episodes.tree import map_structure

# Outputs of the module-to-env pipeline that are stored in the episode as extra model outputs.
RECORDED_OUTPUTS = (
    Columns.ACTION_LOGP,
    Columns.ACTION_DIST_INPUTS,
    Columns.VF_PREDS,
    Columns.STATE_OUT,
    Columns.MODEL_VERSION,
)


@dataclass(frozen=True)
class SessionSpec:
    """What a client declared in its hello."""

    client_id: str
    observation_space: gym.Space
    action_space: gym.Space
    num_envs: int
    explore: bool


class Session:
    """The episodes of one client stream and the actions they are waiting on."""

    def __init__(self, spec: SessionSpec, *, rollout_fragment_length: int, lookback: int) -> None:
        self.id = uuid.uuid4().hex
        self.spec = spec
        self.episodes: list[SingleAgentEpisode | None] = [None] * spec.num_envs
        self._outputs: dict[str, Any] | None = None
        self._fragment = rollout_fragment_length
        self._lookback = lookback

    def observe(
        self,
        obs: Any,
        rewards: np.ndarray,
        terminateds: np.ndarray,
        truncateds: np.ndarray,
        infos: list[dict] | None,
    ) -> tuple[list[SingleAgentEpisode], int]:
        """Append one step of every sub-env.

        Returns the episodes, row by row, that the next actions are for, and how many env steps
        (transitions, not reset observations) were appended.
        """
        outputs = self._outputs
        current: list[SingleAgentEpisode] = []
        steps = 0
        for i, episode in enumerate(self.episodes):
            row_obs = row(obs, i)
            info = infos[i] if infos else {}
            if episode is None or episode.is_done or outputs is None:
                episode = SingleAgentEpisode(
                    observation_space=self.spec.observation_space, action_space=self.spec.action_space
                )
                self.episodes[i] = episode
                episode.add_env_reset(observation=row_obs, infos=info)
            else:
                episode.add_env_step(
                    observation=row_obs,
                    action=row(outputs[Columns.ACTIONS], i),
                    reward=float(rewards[i]),
                    infos=info,
                    terminated=bool(terminateds[i]),
                    truncated=bool(truncateds[i]),
                    extra_model_outputs={k: row(outputs[k], i) for k in RECORDED_OUTPUTS if k in outputs},
                )
                steps += 1
            current.append(episode)
        return current, steps

    def record(self, outputs: dict[str, Any]) -> list[SingleAgentEpisode]:
        """Keep this step's actions and outputs (rows = sub-envs); return the chunks now due for shipping."""
        self._outputs = outputs
        return self._take_done() + self._cut(lambda episode: len(episode) >= self._fragment)

    def flush(self) -> list[SingleAgentEpisode]:
        """Ship every step taken so far: ended episodes, and running ones cut now (their successors go on)."""
        return self._take_done() + self._cut(lambda episode: len(episode) > 0)

    def _take_done(self) -> list[SingleAgentEpisode]:
        """Ended episodes leave their slot (the sub-env's next observation starts a new one)."""
        done = []
        for i, episode in enumerate(self.episodes):
            if episode is not None and episode.is_done:
                done.append(episode)
                self.episodes[i] = None
        return done

    def _cut(self, due: Callable[[SingleAgentEpisode], bool]) -> list[SingleAgentEpisode]:
        chunks = []
        for i, episode in enumerate(self.episodes):
            if episode is not None and not episode.is_done and due(episode):
                chunks.append(episode)
                self.episodes[i] = episode.cut(len_lookback_buffer=self._lookback)  # chunk_index + 1
        return chunks

    def close(self) -> list[SingleAgentEpisode]:
        """End the session: every running episode with at least one step is cut off as truncated."""
        unfinished = []
        for episode in self.episodes:
            if episode is not None and not episode.is_done and len(episode) > 0:
                episode.is_truncated = True
                unfinished.append(episode)
        self.episodes = [None] * self.spec.num_envs
        return unfinished


def row(value: Any, i: int) -> Any:
    """Row i of an array, or of every array in a dict / tuple nesting (plain arrays first: the hot path)."""
    if isinstance(value, np.ndarray):
        return value[i]
    return map_structure(lambda column: column[i], value)
