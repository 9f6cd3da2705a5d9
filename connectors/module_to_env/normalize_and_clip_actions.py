"""NormalizeAndClipActions: ACTIONS_FOR_ENV, the module's actions made fit for the env's Box bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import is_batched
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns
from rlgate.core.spaces import space_struct
from rlgate.core.tree import flatten, map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


def unsquash_action(action: Any, space: gym.Space) -> Any:
    """Map actions from [-1, 1] to the bounds of each bounded float Box leaf (then clip); shift int Boxes.

    Works on one action or a batch (leading axis) of them. RLlib's `low + (a + 1) * (high - low) / 2`, computed
    as `mid + a * half` in float64: `high - low` overflows to inf for bounds near the dtype's limits (float32's
    +-3.4e38), which made every action `high` (or NaN). Unlike RLlib 2.60, every floating Box is unsquashed (RLlib
    only float32 and float64 ones: a float16 Box's actions passed through as they were), and results keep the
    space's dtype (RLlib's `low + a` for an int32 Box and int64 actions gave int64).
    """

    def unsquash(a: Any, sub: gym.Space) -> Any:
        if not isinstance(sub, gym.spaces.Box) or not (sub.is_bounded("both")):
            return a
        if np.issubdtype(sub.dtype, np.floating):
            low, high = sub.low.astype(np.float64) / 2.0, sub.high.astype(np.float64) / 2.0
            with np.errstate(over="ignore"):  # only actions far outside [-1, 1], which the clip takes to a bound
                a = (low + high) + np.asarray(a, np.float64) * (high - low)
            return np.clip(a, sub.low, sub.high).astype(sub.dtype, copy=False)
        return (sub.low + np.asarray(a)).astype(sub.dtype, copy=False)

    return map_structure(unsquash, action, space_struct(space))


def clip_action(action: Any, space: gym.Space) -> Any:
    """Clip the Box leaves of one action or a batch of them to their bounds."""

    def clip(a: Any, sub: gym.Space) -> Any:
        return np.clip(a, sub.low, sub.high) if isinstance(sub, gym.spaces.Box) else a

    return map_structure(clip, action, space_struct(space))


class NormalizeAndClipActions(ConnectorV2):
    """Write ACTIONS_FOR_ENV: unsquashed (`normalize_actions`) or clipped (`clip_actions`) ACTIONS.

    ACTIONS stay raw (they go into the episode; the learner's logp needs them); ACTIONS_FOR_ENV go to the
    env. Unlike RLlib, ACTIONS_FOR_ENV is always written (the same object as ACTIONS when neither flag is
    set), so a caller never needs a fallback. Batched ACTIONS are transformed in one vectorised step.
    Multi-agent: the action space is a Dict by agent id; each agent's actions use its own space.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        normalize_actions: bool,
        clip_actions: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.normalize_actions = normalize_actions
        self.clip_actions = clip_actions
        self._box_checked_for: gym.Space | None = None
        self._box = True

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        actions = batch[Columns.ACTIONS]
        if not (self.normalize_actions or self.clip_actions) or not self._has_box():
            batch[Columns.ACTIONS_FOR_ENV] = actions
        elif is_batched(actions):
            batch[Columns.ACTIONS_FOR_ENV] = self._for_env(actions)
        else:
            batch[Columns.ACTIONS_FOR_ENV] = {
                key: [self._for_env(action, key) for action in items] for key, items in actions.items()
            }
        return batch

    def _has_box(self) -> bool:
        """Whether the action space has a Box leaf (only those are unsquashed or clipped); kept per space."""
        space = self.action_space
        if space is not self._box_checked_for:
            self._box_checked_for = space
            self._box = any(isinstance(leaf, gym.spaces.Box) for leaf in flatten(space_struct(space)))
        return self._box

    def _for_env(self, action: Any, key: tuple = ()) -> Any:
        """The action for the env; multi-agent keys (eps id, agent id, module id) take the agent's space."""
        space = self.action_space
        if len(key) == 3:
            assert isinstance(space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            space = space[key[1]]
        assert space is not None  # set by the pipeline before actions come
        if self.normalize_actions:
            return unsquash_action(action, space)
        return clip_action(action, space)
