"""SAC's default module: a policy and (twin) Q networks (RLlib's DefaultSACTorchRLModule), for Box actions (a
tanh-squashed Gaussian policy, Q of observation and action) or Discrete ones (a Categorical policy, Q per action)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.models.catalog import UnsupportedSpace, build_encoder
from rlgate.models.config import ModelConfig
from rlgate.models.distributions import Categorical, Distribution, SquashedGaussian
from rlgate.models.networks import MLP, torch_default_init
from rlgate.models.rl_module import RLModule

#: The Q networks' attribute names (the learner keeps target copies of these).
Q_NETWORKS = ("qf_encoder", "qf", "qf_twin_encoder", "qf_twin")


class SACModule(RLModule):
    """pi_encoder -> pi (ACTION_DIST_INPUTS), and qf_encoder -> qf [, qf_twin_encoder -> qf_twin with `twin_q`].

    Sampling (inference, exploration) runs the policy only: GetActions samples the SquashedGaussian (actions in
    [-1, 1], which NormalizeAndClipActions maps to the env's bounds) or the Categorical, or takes its greedy action.
    Box actions need 1-D Box observations (Q takes them concatenated with the action).
    """

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig, *, twin_q: bool = True
    ) -> None:
        misfit = self.action_space_misfit(action_space)
        if misfit:
            raise UnsupportedSpace(misfit)
        discrete = isinstance(action_space, gym.spaces.Discrete)
        flat = isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1
        if not discrete and not flat:
            raise UnsupportedSpace(
                f"SAC with Box actions takes 1-D Box observations (its Q networks read them with the action); they "
                f"are {observation_space}"
            )
        super().__init__(observation_space, action_space, model_config)
        self.action_dist_cls: type[Distribution] = Categorical if discrete else SquashedGaussian
        self.discrete = discrete
        if isinstance(action_space, gym.spaces.Discrete):
            outputs = int(action_space.n)
        else:
            assert action_space.shape is not None  # a 1-D Box (action_space_misfit)
            outputs = 2 * action_space.shape[0]
        self.pi_encoder = build_encoder(observation_space, model_config)
        self.pi = self._head(self.pi_encoder.out_dim, outputs, model_config)
        self.qf_encoder, self.qf = self._q_network(model_config)
        self.qf_twin_encoder: nn.Module | None
        self.qf_twin: MLP | None
        self.qf_twin_encoder, self.qf_twin = self._q_network(model_config) if twin_q else (None, None)
        if not model_config.ortho_init:
            torch_default_init(self)

    @staticmethod
    def action_space_misfit(action_space: gym.Space) -> str | None:
        """Why SAC cannot act in this action space, or None: it takes a 1-D float Box or a Discrete (from 0)."""
        if isinstance(action_space, gym.spaces.Discrete) and action_space.start == 0:
            return None
        if (
            isinstance(action_space, gym.spaces.Box)
            and len(action_space.shape) == 1
            and np.issubdtype(action_space.dtype, np.floating)
            and action_space.is_bounded("both")
        ):
            return None
        return f"SAC takes a bounded 1-D float Box or a Discrete action space; the env's is {action_space}"

    @staticmethod
    def _head(in_dim: int, out_dim: int, config: ModelConfig) -> MLP:
        return MLP(in_dim, config.head_fcnet_hiddens, config.head_fcnet_activation, out_dim=out_dim, out_gain=0.01)

    def _q_network(self, config: ModelConfig) -> tuple[nn.Module, MLP]:
        """An encoder and a head: of the observation (Q per action) or of observation and action (one Q)."""
        if isinstance(self.action_space, gym.spaces.Discrete):  # self.discrete
            encoder = build_encoder(self.observation_space, config)
            return encoder, self._head(encoder.out_dim, int(self.action_space.n), config)
        assert self.observation_space.shape is not None and self.action_space.shape is not None  # 1-D Boxes
        size = self.observation_space.shape[0] + self.action_space.shape[0]
        encoder = MLP(size, config.fcnet_hiddens, config.fcnet_activation)
        return encoder, MLP(encoder.out_dim, config.head_fcnet_hiddens, config.head_fcnet_activation, out_dim=1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self.pi_encoder(batch[Columns.OBS]))}

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor | None = None, *, twin: bool = False) -> torch.Tensor:
        """Q [B] of these observations and Box actions, or Q [B, n] per Discrete action (actions None); the twin
        network's with `twin`."""
        encoder, head = (self.qf_twin_encoder, self.qf_twin) if twin else (self.qf_encoder, self.qf)
        assert encoder is not None and head is not None  # twin only with twin_q
        if self.discrete:
            return head(encoder(obs))
        assert actions is not None  # Box actions: Q of these
        return head(encoder(torch.cat([obs.float(), actions], -1))).squeeze(-1)

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        """The smaller Q estimate of the policy's greedy action (Box), or of the greedy action's Q (Discrete)."""
        dist = self.get_inference_action_dist_cls().from_logits(self._forward(batch)[Columns.ACTION_DIST_INPUTS])
        obs = batch[Columns.OBS]
        if self.discrete:
            q = self.q_values(obs)
            q = torch.min(q, self.q_values(obs, twin=True)) if self.qf_twin is not None else q
            return q.gather(-1, dist.to_deterministic().sample().unsqueeze(-1)).squeeze(-1)
        action = dist.to_deterministic().sample()
        q = self.q_values(obs, action)
        return torch.min(q, self.q_values(obs, action, twin=True)) if self.qf_twin is not None else q
