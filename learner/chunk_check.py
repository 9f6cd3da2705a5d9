"""What a chunk must hold for the learner to train on it, beyond decoding: finite values, data of its spaces,
the model outputs its algorithm needs.

A non-finite reward or model output poisons the update it is batched into. A chunk that decodes can still
break every update it is batched into (observations of another shape, a Discrete action of 5 for 2 actions,
distribution inputs of another width, no `action_logp`, model versions of another dtype or shape, a model
output the other chunks lack or do not have), and with it every other server's steps in that batch; or be
trained on quietly while meaning nothing (float actions for a Discrete space, integer log-probabilities). The
intake refuses such chunks with the reason `misfit` names. Values are not held to the observation space's
bounds: the chunk holds what the servers' env-to-module pieces wrote back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.columns import RECORDED_OUTPUTS, Columns
from rlgate.core.spaces import space_struct
from rlgate.core.tree import flatten
from rlgate.episodes import SingleAgentEpisode
from rlgate.models import RLModule
from rlgate.models.outputs import output_shapes


def misfit(
    observations: Any,
    actions: Any,
    rewards: np.ndarray,
    outputs: Mapping[str, Any],
    spaces: tuple[gym.Space | None, gym.Space | None],
    output_shapes: Mapping[str, tuple[int, ...]],
    *,
    finite_observations: bool = True,
) -> str | None:
    """Why the chunk (or the table of chunks) with these columns cannot be trained on, or None.

    The columns are arrays with a row per step (lookback included; nested for Dict and Tuple spaces).
    Checked: model outputs only of those servers record (`RECORDED_OUTPUTS`), with model versions and each recorded
    one of `output_shapes` there (each output's shape per step the learner's algorithm needs: its module's sampling
    outputs, `models.outputs.output_shapes`, and PPO's action_logp, `learner_output_shapes`), of those shapes (model
    versions one per step); every reward and model
    output finite (observations too, if `finite_observations`) and of a float dtype (model versions int64);
    observations and actions of `spaces` (observation space, action space: those they were decoded in). Each
    check is of all rows at once, so a table passes only if each of its chunks would.
    """
    if any(key not in RECORDED_OUTPUTS for key in outputs):  # named in the log, not in the reason (a metric label)
        return "unknown model outputs"
    column = _non_finite(rewards, outputs, observations if finite_observations else None)
    if column is not None:
        return f"non-finite {column}"
    column = _of_another_dtype(rewards, outputs)
    if column is not None:
        return f"{column} of another dtype"
    observation_space, action_space = spaces
    if not _fits(observations, observation_space, _observation_fits):
        return "observations not of the observation space"
    if not _fits(actions, action_space, _action_fits):
        return "actions not of the action space"
    # An update batches every chunk's outputs as columns: one chunk without a column the others have breaks it.
    required = (*(k for k in output_shapes if k in RECORDED_OUTPUTS), Columns.MODEL_VERSION)
    for key in required:
        if key not in outputs:
            return f"no {key}"
    for key, shape in {Columns.MODEL_VERSION: (), **output_shapes}.items():
        output = outputs.get(key)
        if output is not None and any(leaf.shape[1:] != shape for leaf in flatten(output)):
            return f"{key} of another shape"
    return None


def learner_output_shapes(module: RLModule, algorithm: str) -> dict[str, tuple[int, ...]]:
    """The recorded outputs (and their shapes per step) a chunk must hold for `algorithm` to train on it: PPO's
    are its module's sampling outputs and the behaviour policy's action_logp (GetActions'); DQN and SAC replay
    observations, actions and rewards alone, so chunks of greedy sessions (no action_logp) train too."""
    if algorithm != "PPO":
        return {}
    return {Columns.ACTION_LOGP: (), **output_shapes(module)}


def episode_misfit(
    episode: SingleAgentEpisode, output_shapes: Mapping[str, tuple[int, ...]], *, finite_observations: bool = True
) -> str | None:
    """`misfit` of one decoded chunk, in its own spaces."""
    return misfit(
        episode.observations.data,
        episode.actions.data,
        episode.rewards.data,
        {key: buffer.data for key, buffer in episode.extra_model_outputs.items()},
        (episode.observation_space, episode.action_space),
        output_shapes,
        finite_observations=finite_observations,
    )


def _non_finite(rewards: np.ndarray, outputs: Mapping[str, Any], observations: Any) -> str | None:
    """The first of "rewards", "model outputs" (logp, values, distribution inputs) and, unless None,
    "observations" that holds +-inf or NaN; None when all are finite."""
    columns = {"rewards": rewards, "model outputs": tuple(outputs.values())}
    if observations is not None:
        columns["observations"] = observations
    for name, data in columns.items():
        for leaf in flatten(data):
            array = np.asarray(leaf)
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                return name
    return None


def _of_another_dtype(rewards: np.ndarray, outputs: Mapping[str, Any]) -> str | None:
    """The first of "rewards" and the model outputs that is not of its dtype: a float one (any width), but model
    versions int64. Torch cannot subtract unsigned or bool tensors (a failed update drops every server's steps in
    it), and integer rewards or log-probabilities would train quietly on what they do not mean."""
    if rewards.dtype.kind != "f":
        return "rewards"
    for key, output in outputs.items():
        int64 = key == Columns.MODEL_VERSION
        if any((leaf.dtype != np.int64) if int64 else (leaf.dtype.kind != "f") for leaf in flatten(output)):
            return key
    return None


def _fits(data: Any, space: gym.Space | None, leaf_fits: Any) -> bool:
    """Whether data ([rows, ...] per leaf) has the space's nesting, each leaf fitting its leaf space."""
    if space is None:
        return True
    struct = space_struct(space)
    if isinstance(struct, dict):
        assert isinstance(space, gym.spaces.Dict)  # a Dict's struct
        return (
            isinstance(data, dict)
            and list(data) == list(struct)
            and all(_fits(data[key], space[key], leaf_fits) for key in struct)
        )
    if isinstance(struct, tuple):
        assert isinstance(space, gym.spaces.Tuple)  # a Tuple's struct
        return (
            isinstance(data, tuple)
            and len(data) == len(struct)
            and all(_fits(item, sub, leaf_fits) for item, sub in zip(data, space.spaces, strict=True))
        )
    return isinstance(data, np.ndarray) and data.ndim >= 1 and leaf_fits(data, space)


def _observation_fits(data: np.ndarray, space: gym.Space) -> bool:
    return data.shape[1:] == space.shape and data.dtype.kind in "biuf"


def _action_fits(data: np.ndarray, space: gym.Space) -> bool:
    """Discrete kinds: integers in range; Box: its shape, finite (a float Box's actions are the model's, unclipped)."""
    if data.shape[1:] != space.shape:
        return False
    if isinstance(space, gym.spaces.Box) and data.dtype.kind == "f":
        return bool(np.isfinite(data).all())
    if data.dtype.kind not in "biu":
        return False
    if isinstance(space, gym.spaces.Discrete):
        low, high = space.start, space.start + space.n - 1
    elif isinstance(space, gym.spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec - 1
    elif isinstance(space, gym.spaces.MultiBinary):
        low, high = 0, 1
    elif isinstance(space, gym.spaces.Box):
        low, high = space.low, space.high
    else:
        return False
    return bool(((data >= low) & (data <= high)).all())
