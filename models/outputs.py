"""What a module's acting forwards make, found by running them once on a sample observation.

A user's module whose distribution inputs do not fit its action space (4 logits for 2 actions) samples
actions no env takes; one that returns `logits` where `action_dist_inputs` is expected gives no actions at all;
the learner takes chunks only with the outputs its own module makes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.models.catalog import action_distribution
from rlgate.models.distributions import Categorical, DiagGaussian, MultiCategorical
from rlgate.models.rl_module import RLModule

_FAMILIES = (Categorical, MultiCategorical, DiagGaussian)  # rlgate's own, whose input width the space sets


def probe_batch(module: RLModule) -> dict[str, Any]:
    """A batch of one sample of the module's observation space, as env-to-module hands it to an acting forward: a
    stateful module's with a time axis of 1 and its initial state as STATE_IN; on the module's device (a learner's
    may be a GPU)."""
    sample = module.observation_space.sample()
    device = next(module.parameters(), torch.empty(0)).device

    def batched(x: Any, axes: tuple[None, ...]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x)[axes], device=device)

    if not module.is_stateful():
        return {Columns.OBS: map_structure(lambda x: batched(x, (None,)), sample)}
    return {
        Columns.OBS: map_structure(lambda x: batched(x, (None, None)), sample),
        Columns.STATE_IN: map_structure(lambda s: torch.as_tensor(s, device=device)[None], module.get_initial_state()),
    }


def output_shapes(module: RLModule) -> dict[str, tuple[int, ...]]:
    """The shape per step of each output of the module's sampling forward, on one sample of its observation
    space; none for a stateful module (whose outputs have a time axis)."""
    if module.is_stateful():
        return {}
    with torch.inference_mode():
        outputs = module.forward_exploration(probe_batch(module))
    return {key: tuple(value.shape[1:]) for key, value in outputs.items() if isinstance(value, torch.Tensor)}


def missing_outputs(module: RLModule) -> str | None:
    """What the module's acting forwards (forward_exploration, forward_inference) fail to return, or None.

    Each must return ACTION_DIST_INPUTS (what GetActions samples from) or ACTIONS, and a stateful module also
    STATE_OUT; a module returning `logits` instead would otherwise fail only when it first acts, with a KeyError
    blamed on the env clients. A module whose forward needs more than an observation (columns a user's piece
    adds) cannot be probed here: None, it is checked by acting."""
    batch = probe_batch(module)
    try:
        with torch.inference_mode():
            made = {name: getattr(module, name)(dict(batch)) for name in ("forward_exploration", "forward_inference")}
    except Exception:
        return None
    for name, outputs in made.items():
        if not isinstance(outputs, Mapping):
            return f"its {name} returned {type(outputs).__name__}, not a dict of outputs"
        if Columns.ACTIONS not in outputs and Columns.ACTION_DIST_INPUTS not in outputs:
            return (
                f"its {name} returned no {Columns.ACTION_DIST_INPUTS!r} (the inputs of its action distribution) "
                f"nor {Columns.ACTIONS!r}: it returned {sorted(map(str, outputs))}"
            )
        if module.is_stateful() and Columns.STATE_OUT not in outputs:
            return f"it is stateful, but its {name} returned no {Columns.STATE_OUT!r} (its next state)"
    return None


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
