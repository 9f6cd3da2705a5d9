"""RLModules (RLlib's new API stack contract) and MultiRLModule, action distributions, the default catalog, weights.

The names load on first use (PEP 562): a process that only reads a run spec (env clients, `rlgate up`)
imports `rlgate.models.config` without paying for torch.
"""

import importlib
from typing import Any

_EXPORTS = {
    "ActorCriticModule": "rlgate.models.actor_critic",
    "build_module": "rlgate.models.actor_critic",
    "parameter_count": "rlgate.models.actor_critic",
    "ModelConfig": "rlgate.models.config",
    "Categorical": "rlgate.models.distributions",
    "Deterministic": "rlgate.models.distributions",
    "DiagGaussian": "rlgate.models.distributions",
    "Distribution": "rlgate.models.distributions",
    "MultiCategorical": "rlgate.models.distributions",
    "SquashedGaussian": "rlgate.models.distributions",
    "DQNModule": "rlgate.models.dqn",
    "SACModule": "rlgate.models.sac",
    "MultiRLModule": "rlgate.models.multi_rl_module",
    "dist_inputs_misfit": "rlgate.models.outputs",
    "missing_outputs": "rlgate.models.outputs",
    "output_shapes": "rlgate.models.outputs",
    "RLModule": "rlgate.models.rl_module",
    "load_weights": "rlgate.models.weights",
    "weights_to_bytes": "rlgate.models.weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlgate.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
