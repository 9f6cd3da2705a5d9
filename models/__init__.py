"""RLModules (RLlib's new API stack contract), action distributions, the default catalog, weights."""

from rlgate.models.actor_critic import ActorCriticModule, build_module
from rlgate.models.config import ModelConfig
from rlgate.models.distributions import Categorical, Deterministic, DiagGaussian, Distribution, MultiCategorical
from rlgate.models.rl_module import RLModule
from rlgate.models.weights import load_weights, weights_to_bytes

__all__ = [
    "ActorCriticModule",
    "Categorical",
    "Deterministic",
    "DiagGaussian",
    "Distribution",
    "ModelConfig",
    "MultiCategorical",
    "RLModule",
    "build_module",
    "load_weights",
    "weights_to_bytes",
]
