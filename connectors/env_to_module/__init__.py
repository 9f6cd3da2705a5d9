"""Optional env-to-module pieces (the defaults live in connectors.common)."""

from rlgate.connectors.env_to_module.flatten_observations import FlattenObservations
from rlgate.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
from rlgate.connectors.env_to_module.mean_std_filter import MeanStdFilter
from rlgate.connectors.env_to_module.observation_preprocessor import ObservationPreprocessor
from rlgate.connectors.env_to_module.prev_actions_prev_rewards import PrevActionsPrevRewards

__all__ = [
    "FlattenObservations",
    "FrameStackingEnvToModule",
    "MeanStdFilter",
    "ObservationPreprocessor",
    "PrevActionsPrevRewards",
]
