"""FrameStackingLearner: FrameStacking in a learner pipeline (as RLlib names it)."""

from functools import partial

from rlgate.connectors.common.frame_stacking import FrameStacking

FrameStackingLearner = partial(FrameStacking, as_learner_connector=True)
