"""Connector pieces used by more than one pipeline (env-to-module and learner)."""

from connectors.common.add_observations_from_episodes_to_batch import AddObservationsFromEpisodesToBatch
from connectors.common.add_states_from_episodes_to_batch import AddStatesFromEpisodesToBatch
from connectors.common.add_time_dim_to_batch_and_zero_pad import AddTimeDimToBatchAndZeroPad
from connectors.common.batch_individual_items import BatchIndividualItems
from connectors.common.frame_stacking import FrameStacking
from connectors.common.numpy_to_tensor import NumpyToTensor
from connectors.common.tensor_to_numpy import TensorToNumpy

__all__ = [
    "AddObservationsFromEpisodesToBatch",
    "AddStatesFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "BatchIndividualItems",
    "FrameStacking",
    "NumpyToTensor",
    "TensorToNumpy",
]
