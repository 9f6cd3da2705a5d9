"""Learner pieces: from finished episodes to a train batch (PPO's advantages, DQN's and SAC's next observations)."""

from rlgate.connectors.learner.add_columns_from_episodes_to_train_batch import AddColumnsFromEpisodesToTrainBatch
from rlgate.connectors.learner.add_next_observations_from_episodes_to_train_batch import (
    AddNextObservationsFromEpisodesToTrainBatch,
)
from rlgate.connectors.learner.add_one_ts_to_episodes_and_truncate import (
    AddOneTsToEpisodesAndTruncate,
    remove_last_ts_from_episodes_and_restore_truncateds,
)
from rlgate.connectors.learner.frame_stacking import FrameStackingLearner
from rlgate.connectors.learner.general_advantage_estimation import (
    GeneralAdvantageEstimation,
    compute_value_targets,
    compute_vtrace_targets,
)
from rlgate.connectors.learner.normalize_rewards import NormalizeRewards

__all__ = [
    "AddColumnsFromEpisodesToTrainBatch",
    "AddNextObservationsFromEpisodesToTrainBatch",
    "AddOneTsToEpisodesAndTruncate",
    "FrameStackingLearner",
    "GeneralAdvantageEstimation",
    "NormalizeRewards",
    "compute_value_targets",
    "compute_vtrace_targets",
    "remove_last_ts_from_episodes_and_restore_truncateds",
]
