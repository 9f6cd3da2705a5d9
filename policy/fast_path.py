"""The batched fast path: which pieces run when the caller hands the latest observations in as one [B, ...] OBS.

A step message (the server) or a vector env (`rlgate.Policy.compute_actions`) holds its sub-envs' latest
observations as one array. The env-to-module pipeline may start from it only when every piece keeps that OBS
equal to what it writes into the episodes, which pieces promise with `accepts_batched_obs` (the built-in ones
do). Otherwise it runs from an empty batch, as RLlib's EnvRunner runs it: a user's piece that rewrites the
episodes' latest observation (RLlib's docs write them so) is then what the module sees.

With the default pieces alone and a stateless module, seven of the eleven default pieces return a batched batch
as they got it: AddObservationsFromEpisodesToBatch (OBS is there already), AddTimeDimToBatchAndZeroPad and
AddStatesFromEpisodesToBatch (no state), BatchIndividualItems, UnBatchToIndividualItems,
RemoveSingleTsTimeRankFromBatch and ListifyDataForVectorEnv (every column is batched). Calling only the other
four, NumpyToTensor, GetActions, TensorToNumpy and NormalizeAndClipActions, with the same arguments, gives the
same outputs for less than half the dispatch: the pieces are still the pipelines' own objects, so their
settings and state are too.
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

#: The pieces one batch runs: env-to-module's, then (after the forward) module-to-env's. A pipeline is itself
#: a piece, so running the pipelines whole is `([env_to_module], [module_to_env])`.
Pieces = tuple[list[ConnectorV2], list[ConnectorV2]]


def batched_pieces(
    module: RLModule, env_to_module: ConnectorPipelineV2, module_to_env: ConnectorPipelineV2
) -> Pieces | None:
    """What runs a batch that starts from a batched OBS: only the acting pieces when both pipelines hold the
    default pieces alone and the module is stateless, else the pipelines whole; None when a piece of the
    env-to-module pipeline does not take a batched OBS (start from an empty batch then)."""
    if not env_to_module.takes_batched_obs():
        return None
    if module.is_stateful() or not (_only(env_to_module, ENV_TO_MODULE) and _only(module_to_env, MODULE_TO_ENV)):
        return [env_to_module], [module_to_env]
    return _acting(env_to_module), _acting(module_to_env)


def _only(pipeline: ConnectorPipelineV2, defaults: tuple[type, ...]) -> bool:
    return tuple(type(piece) for piece in pipeline.connectors) == defaults


def _acting(pipeline: ConnectorPipelineV2) -> list[ConnectorV2]:
    return [piece for piece in pipeline.connectors if type(piece) in ACTING]
