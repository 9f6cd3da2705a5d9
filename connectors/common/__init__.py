"""Connector pieces used by more than one pipeline (env-to-module and learner)."""

from rlgate.connectors.common.add_observations_from_episodes_to_batch import AddObservationsFromEpisodesToBatch
from rlgate.connectors.common.add_states_from_episodes_to_batch import AddStatesFromEpisodesToBatch
from rlgate.connectors.common.add_time_dim_to_batch_and_zero_pad import AddTimeDimToBatchAndZeroPad
from rlgate.connectors.common.agent_to_module_mapping import AgentToModuleMapping
from rlgate.connectors.common.batch_individual_items import BatchIndividualItems
from rlgate.connectors.common.frame_stacking import FrameStacking
from rlgate.connectors.common.module_to_agent_unmapping import ModuleToAgentUnmapping
from rlgate.connectors.common.numpy_to_tensor import NumpyToTensor
from rlgate.connectors.common.tensor_to_numpy import TensorToNumpy

__all__ = [
    "AddObservationsFromEpisodesToBatch",
    "AddStatesFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "AgentToModuleMapping",
    "BatchIndividualItems",
    "FrameStacking",
    "ModuleToAgentUnmapping",
    "NumpyToTensor",
    "TensorToNumpy",
]
