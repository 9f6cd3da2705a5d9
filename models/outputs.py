"""What a module's sampling forward makes, found by running it once on a sample observation.

A user's module whose distribution inputs do not fit its action space (4 logits for 2 actions) samples
actions no env takes; the learner takes chunks only with the outputs its own module makes.
"""

from __future__ import annotations

import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.models.catalog import action_distribution
from rlgate.models.distributions import Categorical, DiagGaussian, MultiCategorical
from rlgate.models.rl_module import RLModule

_FAMILIES = (Categorical, MultiCategorical, DiagGaussian)  # rlgate's own, whose input width the space sets


def output_shapes(module: RLModule) -> dict[str, tuple[int, ...]]:
    """The shape per step of each output of the module's sampling forward, on one sample of its observation
    space; none for a stateful module (whose forward takes a state)."""
    if module.is_stateful():
        return {}
    sample = module.observation_space.sample()
    observations = {Columns.OBS: map_structure(lambda x: torch.as_tensor(np.asarray(x)[None]), sample)}
    with torch.inference_mode():
        outputs = module.forward_exploration(observations)
    return {key: tuple(value.shape[1:]) for key, value in outputs.items() if isinstance(value, torch.Tensor)}


def dist_inputs_misfit(module: RLModule) -> str | None:
    """Why the module's distribution inputs do not fit its action space, or None: checked where its exploration
    distribution is rlgate's own for that space (a user's distribution says nothing of its width)."""
    try:
        expected_cls, expected = action_distribution(module.action_space)
    except ValueError:
        return None
    dist_cls = module.get_exploration_action_dist_cls()
    family = next((f for f in _FAMILIES if isinstance(dist_cls, type) and issubclass(dist_cls, f)), None)
    if family is None or not issubclass(expected_cls, family):
        return None
    shape = output_shapes(module).get(Columns.ACTION_DIST_INPUTS)
    if shape is None or shape == (expected,):
        return None
    over = f"{family.__name__} over {module.action_space}"
    return f"its action_dist_inputs have shape {shape} per step; {over} takes ({expected},)"
