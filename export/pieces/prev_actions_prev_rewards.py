"""PrevActionsPrevRewards folded: the last actions and rewards are state, the reward an input."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlgate.connectors.env_to_module import PrevActionsPrevRewards
from rlgate.export.folded import Folded, flat_leaf, piece_spaces


class FoldedPrevActionsPrevRewards(Folded):
    """The observation as the piece's Dict: `_orig_obs`, `prev_n_actions` (the last n actions, Discrete and
    MultiDiscrete one-hot) and `prev_n_rewards` (the last n rewards, this step's `reward` input the newest).

    State `prev_n_actions`: the actions up to the previous one, flat as the Dict holds them; the graph appends the
    action it chooses. State `prev_n_rewards`: the rewards up to the one before `reward`. Both start at zeros."""

    uses_reward = True

    def __init__(self, piece: PrevActionsPrevRewards, agent: str | None) -> None:
        super().__init__()
        _, self.output_space, self.action_space = piece_spaces(piece, agent)
        self.n_actions, self.n_rewards = piece.n_prev_actions, piece.n_prev_rewards
        self.keys = (piece.ORIG_OBS_KEY, piece.PREV_ACTIONS_KEY, piece.PREV_REWARDS_KEY)
        if self.n_actions:
            size = self.output_space[piece.PREV_ACTIONS_KEY].shape[0]
            self.initial_state["prev_n_actions"] = np.zeros(size, np.float32)
        if self.n_rewards:
            self.initial_state["prev_n_rewards"] = np.zeros(self.n_rewards, np.float32)
        self.uses_reward = bool(self.n_rewards)

    def forward(self, obs: Any, state: dict[str, torch.Tensor], reward: torch.Tensor | None) -> tuple[Any, dict]:
        orig, actions_key, rewards_key = self.keys
        parts = {orig: obs}
        state = dict(state)
        if self.n_actions:
            parts[actions_key] = state["prev_n_actions"]
        if self.n_rewards:
            assert reward is not None  # uses_reward: the graph passes it
            state["prev_n_rewards"] = torch.cat([state["prev_n_rewards"][:, 1:], reward.unsqueeze(1)], dim=1)
            parts[rewards_key] = state["prev_n_rewards"]
        return {key: parts[key] for key in self.output_space.spaces}, state  # the Dict space's key order

    def after_actions(self, state: dict[str, torch.Tensor], actions: torch.Tensor) -> dict[str, torch.Tensor]:
        if not self.n_actions:
            return state
        encoded = flat_leaf(self.action_space, actions)
        width = encoded.shape[1]
        return {**state, "prev_n_actions": torch.cat([state["prev_n_actions"][:, width:], encoded], dim=1)}
