"""DQN's default module: Q values per action (dueling heads optional), acting greedily or epsilon-greedily
(RLlib's DefaultDQNTorchRLModule)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlgate.core.columns import Columns
from rlgate.models.catalog import UnsupportedSpace, build_encoder
from rlgate.models.config import ModelConfig
from rlgate.models.networks import MLP, torch_default_init
from rlgate.models.rl_module import RLModule

#: The train forward's Q values of the batch's observations, [B, actions] (RLlib's name).
QF_PREDS = "qf_preds"


class DQNModule(RLModule):
    """Encoder -> advantage head [and value head: Q = V + A - mean(A), with `dueling`] (RLlib's DQN module).

    The exploration forward returns ACTIONS itself, epsilon-greedy (a random action with probability `epsilon`),
    so GetActions leaves them as they are; the inference forward returns the greedy ones. `epsilon` is a buffer:
    the learner sets it from its schedule and it travels with the weights, so every server explores as the
    learner's schedule says by the env steps sampled (RLlib passes the env runner's step count instead). The
    target network is the learner's own copy (learner.dqn), never published.
    """

    epsilon: torch.Tensor  # a buffer (register_buffer)

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        model_config: ModelConfig,
        *,
        dueling: bool = True,
        epsilon: float = 1.0,
    ) -> None:
        misfit = self.action_space_misfit(action_space)
        if misfit:
            raise UnsupportedSpace(misfit)
        super().__init__(observation_space, action_space, model_config)
        assert isinstance(action_space, gym.spaces.Discrete)  # action_space_misfit said so
        self.encoder = build_encoder(observation_space, model_config)
        head = (self.encoder.out_dim, model_config.head_fcnet_hiddens, model_config.head_fcnet_activation)
        self.af = MLP(*head, out_dim=int(action_space.n), out_gain=0.01)
        self.vf = MLP(*head, out_dim=1, out_gain=1.0) if dueling else None
        self.register_buffer("epsilon", torch.tensor(float(epsilon)))
        if not model_config.ortho_init:
            torch_default_init(self)

    @staticmethod
    def action_space_misfit(action_space: gym.Space) -> str | None:
        """Why DQN cannot act in this action space, or None: it takes Discrete actions (starting at 0)."""
        if isinstance(action_space, gym.spaces.Discrete) and action_space.start == 0:
            return None
        return f"DQN takes Discrete actions (starting at 0); the env's are {action_space}: use SAC or PPO"

    def compute_q_values(self, batch: dict[str, Any]) -> torch.Tensor:
        """Q values [B, actions] of the batch's observations (RLlib's QNetAPI)."""
        features = self.encoder(batch[Columns.OBS])
        advantages = self.af(features)
        if self.vf is None:
            return advantages
        return self.vf(features) + advantages - advantages.mean(-1, keepdim=True)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Greedy actions."""
        return {Columns.ACTIONS: self.compute_q_values(batch).argmax(-1)}

    def _forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Epsilon-greedy actions: each a uniformly random one with probability `epsilon`."""
        greedy = self.compute_q_values(batch).argmax(-1)
        assert isinstance(self.action_space, gym.spaces.Discrete)  # action_space_misfit said so
        random = torch.randint_like(greedy, int(self.action_space.n))
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
        return {Columns.ACTIONS: torch.where(explore, random, greedy)}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {QF_PREDS: self.compute_q_values(batch)}

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        """The state values under the greedy policy: max over actions of Q."""
        return self.compute_q_values(batch).max(-1).values
