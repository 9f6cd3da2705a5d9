"""The default pipelines on the server's batched path: only the pieces that act there.

Every single-agent session hands the policy its sub-envs' latest observations as one [B, ...] array (the
batched path). There, with a stateless module, seven of the eleven default pieces return the batch as they
got it: AddObservationsFromEpisodesToBatch (OBS is there already), AddTimeDimToBatchAndZeroPad and
AddStatesFromEpisodesToBatch (no state), BatchIndividualItems, UnBatchToIndividualItems,
RemoveSingleTsTimeRankFromBatch and ListifyDataForVectorEnv (every column is batched). Calling only the other
four, NumpyToTensor, GetActions, TensorToNumpy and NormalizeAndClipActions, with the same arguments, gives the
same outputs for less than half the dispatch: the pieces are still the pipelines' own objects, so their
settings and state are too. A pipeline with any other piece (a user's, or a subclass of a default one) or a
stateful module runs as configured.
"""

from __future__ import annotations

from rlgate.connectors import ConnectorPipelineV2, ConnectorV2
from rlgate.connectors.builders import build_env_to_module_pipeline, build_module_to_env_pipeline
from rlgate.connectors.common import NumpyToTensor, TensorToNumpy
from rlgate.connectors.module_to_env import GetActions, NormalizeAndClipActions
from rlgate.models import RLModule

# The single-agent default pipelines' pieces, in order, as connectors.builders makes them (a multi-agent
# pipeline has AgentToModuleMapping besides), and those that act on the batched path with a stateless module.
ENV_TO_MODULE = tuple(type(piece) for piece in build_env_to_module_pipeline(None, None).connectors)
MODULE_TO_ENV = tuple(type(piece) for piece in build_module_to_env_pipeline(None, None).connectors)
ACTING = (NumpyToTensor, GetActions, TensorToNumpy, NormalizeAndClipActions)


def acting_pieces(
    module: RLModule, env_to_module: ConnectorPipelineV2, module_to_env: ConnectorPipelineV2
) -> tuple[list[ConnectorV2], list[ConnectorV2]] | None:
    """Each pipeline's pieces that act on the batched path, when both hold the default pieces alone and the
    module is stateless; otherwise None (run the pipelines)."""
    if module.is_stateful() or not (_only(env_to_module, ENV_TO_MODULE) and _only(module_to_env, MODULE_TO_ENV)):
        return None
    return _acting(env_to_module), _acting(module_to_env)


def _only(pipeline: ConnectorPipelineV2, defaults: tuple[type, ...]) -> bool:
    return tuple(type(piece) for piece in pipeline.connectors) == defaults


def _acting(pipeline: ConnectorPipelineV2) -> list[ConnectorV2]:
    return [piece for piece in pipeline.connectors if type(piece) in ACTING]
