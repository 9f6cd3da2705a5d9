"""CartPole whose observation space is a user's own Box, with an equality that assumes the other space is a Box
too (no isinstance check, as user code may have): compared with a space of another kind, it raises AttributeError.

For a learner of this env (`env.id` "support.sloppy_space_env:SloppySpaceCartPole") a batch that says its
observations are, say, Discrete makes the intake's own code raise on a batch that decodes: CartPole chunks fit it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.spaces import Box


class SloppyBox(Box):
    def __eq__(self, other: Any) -> bool:
        return bool(np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high))

    __hash__ = None  # as any class that defines __eq__


class SloppySpaceCartPole(CartPoleEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = SloppyBox(self.observation_space.low, self.observation_space.high, dtype=np.float32)
