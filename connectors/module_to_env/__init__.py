"""Module-to-env pieces: from the module's outputs to actions for the env."""

from rlgate.connectors.module_to_env.get_actions import GetActions
from rlgate.connectors.module_to_env.listify_data_for_vector_env import ListifyDataForVectorEnv
from rlgate.connectors.module_to_env.normalize_and_clip_actions import NormalizeAndClipActions
from rlgate.connectors.module_to_env.remove_single_ts_time_rank_from_batch import RemoveSingleTsTimeRankFromBatch
from rlgate.connectors.module_to_env.unbatch_to_individual_items import UnBatchToIndividualItems

__all__ = [
    "GetActions",
    "ListifyDataForVectorEnv",
    "NormalizeAndClipActions",
    "RemoveSingleTsTimeRankFromBatch",
    "UnBatchToIndividualItems",
]
