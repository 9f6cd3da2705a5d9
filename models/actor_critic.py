"""The default module: an actor-critic (RLlib's DefaultPPOTorchRLModule), and `build_module`."""

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.models.catalog import MAX_PARAMETERS, UnsupportedSpace, action_distribution, build_encoder
from rlgate.models.config import ModelConfig
from rlgate.models.distributions import DiagGaussian, Distribution
from rlgate.models.networks import MLP, LSTMEncoder, run_layers, torch_default_init
from rlgate.models.rl_module import RLModule


class ActorCriticModule(RLModule):
    """Encoder -> policy head and value head (RLlib's DefaultPPOTorchRLModule).

    Sampling (inference, exploration) runs the policy head only; the train forward adds VF_PREDS.

    Stateless: an MLP or CNN encoder, and a separate value encoder unless `vf_share_layers`.
    With `use_lstm`: that encoder then an LSTM, shared by both heads; state {"h": [cell], "c": [cell]}.
    The LSTM runs over every step of a zero-padded [B, T] batch; the learner masks the padding (LOSS_MASK).
    Box actions: ACTION_DIST_INPUTS = concat(mean, log_std), log_std clamped to +-log_std_clip_param.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig) -> None:
        super().__init__(observation_space, action_space, model_config)
        self._dist_cls, num_logits = action_distribution(action_space)
        self._stateful = model_config.use_lstm
        encoder = build_encoder(observation_space, model_config)
        self.encoder = LSTMEncoder(encoder, model_config.lstm_cell_size) if self._stateful else encoder
        shared = self._stateful or model_config.vf_share_layers
        self.vf_encoder = None if shared else build_encoder(observation_space, model_config)

        self._gaussian = self._dist_cls is DiagGaussian
        free_log_std = self._gaussian and model_config.free_log_std
        log_std = torch.full((num_logits // 2,), model_config.log_std_init)
        self.log_std = nn.Parameter(log_std) if free_log_std else None
        self._log_std_clip = model_config.log_std_clip_param
        head = (self.encoder.out_dim, model_config.head_fcnet_hiddens, model_config.head_fcnet_activation)
        self.pi = MLP(*head, out_dim=num_logits // 2 if free_log_std else num_logits, out_gain=0.01)
        self.vf = MLP(*head, out_dim=1, out_gain=1.0)
        # The stateless sampling forward as one run of linear layers, encoder then policy head, when the
        # encoder is an MLP: no nn.Module call per submodule (as RLlib's forward_exploration, it runs no
        # hooks; the train forward goes through the submodules' calls).
        stateless_mlp = not self._stateful and isinstance(self.encoder, MLP)
        self._sampling_layers = (
            (*self.encoder.layers, *self.pi.layers) if stateless_mlp and isinstance(self.encoder, MLP) else None
        )
        if not model_config.ortho_init:
            torch_default_init(self)

    def _action_dist_inputs(self, logits: torch.Tensor) -> torch.Tensor:
        """ACTION_DIST_INPUTS from the policy head's output (Box actions: the log std appended, clamped)."""
        if not self._gaussian:
            return logits
        if self.log_std is None:
            mean, log_std = logits.chunk(2, dim=-1)
        else:
            mean, log_std = logits, self.log_std.expand_as(logits)
        return torch.cat([mean, log_std.clamp(-self._log_std_clip, self._log_std_clip)], dim=-1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Sampling: the policy head only (RLlib's DefaultPPOTorchRLModule._forward)."""
        if self._sampling_layers is not None:
            logits = run_layers(self._sampling_layers, batch[Columns.OBS])
            return {Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(logits)}
        if self._stateful:
            features, state_out = self.encoder(batch[Columns.OBS], batch[Columns.STATE_IN])
            return {
                Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(self.pi(features)),
                Columns.STATE_OUT: state_out,
            }
        return {Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(self.pi(self.encoder(batch[Columns.OBS])))}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Training: the policy head and, from the same encoder pass when shared, the value head."""
        obs = batch[Columns.OBS]
        if self._stateful:
            features, state_out = self.encoder(obs, batch[Columns.STATE_IN])
            return {
                Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(self.pi(features)),
                Columns.VF_PREDS: self.vf(features).squeeze(-1),
                Columns.STATE_OUT: state_out,
            }
        features = self.encoder(obs)
        vf_features = features if self.vf_encoder is None else self.vf_encoder(obs)
        return {
            Columns.ACTION_DIST_INPUTS: self._action_dist_inputs(self.pi(features)),
            Columns.VF_PREDS: self.vf(vf_features).squeeze(-1),
        }

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        obs = batch[Columns.OBS]
        if self._stateful:
            features, _ = self.encoder(obs, batch[Columns.STATE_IN])
        else:
            features = (self.encoder if self.vf_encoder is None else self.vf_encoder)(obs)
        return self.vf(features).squeeze(-1)

    def get_initial_state(self) -> dict[str, torch.Tensor]:
        if not self._stateful:
            return {}
        assert self.vf.out is not None  # the value head has its output layer
        zeros = torch.zeros(self.encoder.out_dim, device=self.vf.out.weight.device)
        return {"h": zeros, "c": zeros.clone()}

    def get_train_action_dist_cls(self) -> type[Distribution]:
        return self._dist_cls


def build_module(
    observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig | None = None
) -> RLModule:
    """Build the default actor-critic for these spaces; unsupported spaces raise ValueError (UnsupportedSpace),
    as do spaces that would make it larger than MAX_PARAMETERS: that is found from a build on torch's meta
    device (shapes only, ~1 ms), before any memory is allocated or initialised."""
    config = model_config or ModelConfig()
    shapes = _meta_parameters(observation_space, action_space, config)
    size = sum(p.numel() for p in shapes.values())
    if size > MAX_PARAMETERS:
        name, largest = max(shapes.items(), key=lambda item: item[1].numel())
        raise UnsupportedSpace(
            f"The default model for observations {observation_space} and actions {action_space} would have "
            f"{size:,} parameters, more than the {MAX_PARAMETERS:,} (2**28) rlgate builds: its largest layer, "
            f"{name}, is {' x '.join(map(str, largest.shape))}. Use smaller spaces or model.config "
            f"(fcnet_hiddens), or a module of your own (model.module_class)."
        )
    return ActorCriticModule(observation_space, action_space, config)


def parameter_count(observation_space: gym.Space, action_space: gym.Space, model_config: ModelConfig) -> int:
    """The parameters `build_module` would give the default model for these spaces (from a meta build: ~1 ms, no
    memory); unsupported spaces raise UnsupportedSpace."""
    return sum(p.numel() for p in _meta_parameters(observation_space, action_space, model_config).values())


def _meta_parameters(observation_space: gym.Space, action_space: gym.Space, config: ModelConfig) -> dict[str, Any]:
    with torch.device("meta"):
        return dict(ActorCriticModule(observation_space, action_space, config).named_parameters())
