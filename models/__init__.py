"""RLModules (RLlib's new API stack contract), action distributions, the default catalog, weights."""

from models.actor_critic import ActorCriticModule, build_module
from models.config import ModelConfig
from models.distributions import Categorical, Deterministic, DiagGaussian, Distribution, MultiCategorical
from models.rl_module import RLModule
from models.weights import load_weights, weights_to_bytes

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
