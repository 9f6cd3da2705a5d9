"""FrameStackingEnvToModule: FrameStacking in an env-to-module pipeline (as RLlib names it)."""

from functools import partial

from rlgate.connectors.common.frame_stacking import FrameStacking

FrameStackingEnvToModule = partial(FrameStacking, as_learner_connector=False)
