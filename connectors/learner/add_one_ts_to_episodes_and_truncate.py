"""AddOneTsToEpisodesAndTruncate: one extra step per episode, so the value of its final observation
can be computed in the same forward pass as the others (PPO's bootstrap value)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import MultiAgentEpisode, SingleAgentEpisode
    from rlgate.models import RLModule


class AddOneTsToEpisodesAndTruncate(ConnectorV2):
    """Append to every episode one step (RLlib's PPO learner piece; it changes the episodes in place).

    As RLlib's, it first appends `_<position>` to every episode's id, so that chunks of one episode
    become separate episodes in the batch (and later pieces rename none: see `make_episode_keys_unique`).
    MultiAgentEpisodes get `_<index>` (their place in `episodes`), which their agents' episodes take as
    `multi_agent_episode_id` (their batch key); agents' episodes given without their MultiAgentEpisode get
    `_<position>` on their `multi_agent_episode_id`.

    The step repeats the final observation, info, action and extra model outputs with reward 0, and an
    episode that is not terminated is marked truncated (so is an unfinished chunk). Adds per step:
    LOSS_MASK (False on the extra step), TERMINATEDS and TRUNCATEDS (the episode's flags, after that
    marking, on its last real step; False elsewhere, also on the extra step). GeneralAdvantageEstimation
    then bootstraps a truncated episode with the value of the extra step (the final observation's) and a
    terminated one with 0. Undo it with
    `remove_last_ts_from_episodes_and_restore_truncateds(episodes, orig_truncateds)`; the original flags are
    in `shared_data["orig_truncateds"]`.
    """

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        assert shared_data is not None  # pipelines always pass one
        orig_truncateds = []
        bare_agents = not is_multi_agent(episodes)
        if is_multi_agent(episodes):
            for index, ma_episode in enumerate(episodes):
                ma_episode.id_ = f"{ma_episode.id_}_{index}"
                for agent_episode in ma_episode.agent_episodes.values():
                    agent_episode.multi_agent_episode_id = ma_episode.id_
        for position, episode in enumerate(self.single_agent_episode_iterator(episodes, False)):
            episode.id_ = f"{episode.id_}_{position}"
            if bare_agents and episode.agent_id is not None:
                episode.multi_agent_episode_id = f"{episode.multi_agent_episode_id}_{position}"
            n = len(episode)
            orig_truncateds.append(episode.is_truncated)
            _add_one_ts_and_truncate(episode)
            self.add_n_batch_items(batch, Columns.LOSS_MASK, np.arange(n + 1) < n, n + 1, episode)
            for column, flag in (
                (Columns.TERMINATEDS, episode.is_terminated),
                (Columns.TRUNCATEDS, episode.is_truncated),
            ):
                flags = np.zeros(n + 1, dtype=bool)
                if n:
                    flags[n - 1] = flag
                self.add_n_batch_items(batch, column, flags, n + 1, episode)
        shared_data["_added_loss_mask_for_valid_episode_ts"] = True
        shared_data["orig_truncateds"] = orig_truncateds
        return batch


def _add_one_ts_and_truncate(episode: SingleAgentEpisode) -> None:
    episode.observations.append(episode.get_observations(-1))
    episode.infos.append(episode.get_infos(-1))
    episode.actions.append(episode.get_actions(-1))
    episode.rewards.append(0.0)
    for buffer in episode.extra_model_outputs.values():
        buffer.append(buffer.get(-1))
    episode.t += 1
    if not episode.is_done:
        episode.is_truncated = True


def remove_last_ts_from_episodes_and_restore_truncateds(
    episodes: list[SingleAgentEpisode], orig_truncateds: list[bool]
) -> None:
    """Undo AddOneTsToEpisodesAndTruncate: drop the extra step and restore the truncated flags."""
    for episode, truncated in zip(episodes, orig_truncateds, strict=True):
        for buffer in (episode.observations, episode.infos, episode.actions, episode.rewards):
            buffer.pop()
        for buffer in episode.extra_model_outputs.values():
            buffer.pop()
        episode.t -= 1
        episode.is_truncated = truncated
