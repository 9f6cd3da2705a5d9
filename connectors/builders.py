"""The default env-to-module, module-to-env and learner pipelines (RLlib's AlgorithmConfig builders)."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import torch

from rlgate.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
    ModuleToAgentUnmapping,
    NumpyToTensor,
    TensorToNumpy,
)
from rlgate.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.learner import (
    AddColumnsFromEpisodesToTrainBatch,
    AddNextObservationsFromEpisodesToTrainBatch,
    AddOneTsToEpisodesAndTruncate,
    GeneralAdvantageEstimation,
)
from rlgate.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    UnBatchToIndividualItems,
)

#: A user hook, like RLlib's `env_to_module_connector`: (observation space, action space) -> piece(s).
ConnectorHook = Callable[[gym.Space, gym.Space], ConnectorV2 | list[ConnectorV2]]
#: Multi-agent: each module's (observation space, action space); the env's spaces are then Dicts by agent id.
ModuleSpaces = dict[str, tuple[gym.Space, gym.Space]]


def _user_pieces(
    hook: ConnectorHook | None, observation_space: gym.Space | None, action_space: gym.Space | None
) -> list[ConnectorV2]:
    if hook is None:
        return []
    assert observation_space is not None and action_space is not None  # a hook builds pieces for the env's spaces
    pieces = hook(observation_space, action_space)
    return list(pieces) if isinstance(pieces, list | tuple) else [pieces]


def build_env_to_module_pipeline(
    observation_space: gym.Space | None,
    action_space: gym.Space | None,
    *,
    env_to_module_connector: ConnectorHook | None = None,
    add_default_connectors: bool = True,
    device: torch.device | str = "cpu",
    module_spaces: ModuleSpaces | None = None,
) -> ConnectorPipelineV2:
    """[user pieces] -> AddObservationsFromEpisodesToBatch -> AddTimeDimToBatchAndZeroPad ->
    AddStatesFromEpisodesToBatch -> [AgentToModuleMapping] -> BatchIndividualItems -> NumpyToTensor(device).

    Its output observation space (`pipeline.observation_space`) is the one to build the module for (multi-agent,
    with `module_spaces`: a Dict by module id, after AgentToModuleMapping).
    """
    pipeline = ConnectorPipelineV2(
        observation_space,
        action_space,
        connectors=_user_pieces(env_to_module_connector, observation_space, action_space),
    )
    if add_default_connectors:
        pipeline.append(AddObservationsFromEpisodesToBatch())
        pipeline.append(AddTimeDimToBatchAndZeroPad())
        pipeline.append(AddStatesFromEpisodesToBatch())
        if module_spaces is not None:
            pipeline.append(AgentToModuleMapping(module_spaces=module_spaces))
        pipeline.append(BatchIndividualItems(multi_agent=module_spaces is not None))
        pipeline.append(NumpyToTensor(device=device))
    return pipeline


def build_module_to_env_pipeline(
    observation_space: gym.Space | None,
    action_space: gym.Space | None,
    *,
    module_to_env_connector: ConnectorHook | None = None,
    add_default_connectors: bool = True,
    normalize_actions: bool = True,
    clip_actions: bool = False,
    multi_agent: bool = False,
) -> ConnectorPipelineV2:
    """GetActions -> TensorToNumpy -> UnBatchToIndividualItems -> [ModuleToAgentUnmapping] ->
    RemoveSingleTsTimeRankFromBatch -> [user pieces] -> NormalizeAndClipActions -> ListifyDataForVectorEnv.

    `normalize_actions` and `clip_actions` have RLlib's AlgorithmConfig defaults.
    """
    pipeline = ConnectorPipelineV2(
        observation_space,
        action_space,
        connectors=_user_pieces(module_to_env_connector, observation_space, action_space),
    )
    if add_default_connectors:
        pipeline.prepend(RemoveSingleTsTimeRankFromBatch())
        if multi_agent:
            pipeline.prepend(ModuleToAgentUnmapping())
        pipeline.prepend(UnBatchToIndividualItems())
        pipeline.prepend(TensorToNumpy())
        pipeline.prepend(GetActions())
        pipeline.append(NormalizeAndClipActions(normalize_actions=normalize_actions, clip_actions=clip_actions))
        pipeline.append(ListifyDataForVectorEnv())
    return pipeline


def build_learner_pipeline(
    observation_space: gym.Space | None,
    action_space: gym.Space | None,
    *,
    learner_connector: ConnectorHook | None = None,
    add_default_connectors: bool = True,
    device: torch.device | str = "cpu",
    gae: tuple[float, float] | None = None,
    next_observations: bool = False,
    module_spaces: ModuleSpaces | None = None,
) -> ConnectorPipelineV2:
    """[user pieces] -> AddObservationsFromEpisodesToBatch -> AddColumnsFromEpisodesToTrainBatch ->
    AddTimeDimToBatchAndZeroPad -> AddStatesFromEpisodesToBatch -> [AgentToModuleMapping] ->
    BatchIndividualItems -> NumpyToTensor.

    Multi-agent (`module_spaces`): the batch becomes `{module id: {column: tensor}}` and GAE runs per module.

    `gae=(gamma, lambda_)` adds PPO's pieces (with the defaults): AddOneTsToEpisodesAndTruncate first
    and GeneralAdvantageEstimation(gamma, lambda_) last. `next_observations` adds DQN's and SAC's
    AddNextObservationsFromEpisodesToTrainBatch right after AddObservationsFromEpisodesToBatch (where RLlib's
    DQNLearner inserts it). The spaces are the env-to-module pipeline's
    output spaces (what the episodes hold after its pieces wrote back).
    """
    pipeline = ConnectorPipelineV2(
        observation_space,
        action_space,
        connectors=_user_pieces(learner_connector, observation_space, action_space),
    )
    if add_default_connectors:
        pipeline.append(AddObservationsFromEpisodesToBatch(as_learner_connector=True))
        if next_observations:
            pipeline.append(AddNextObservationsFromEpisodesToTrainBatch())
        pipeline.append(AddColumnsFromEpisodesToTrainBatch())
        pipeline.append(AddTimeDimToBatchAndZeroPad(as_learner_connector=True))
        pipeline.append(AddStatesFromEpisodesToBatch(as_learner_connector=True))
        if module_spaces is not None:
            pipeline.append(AgentToModuleMapping(module_spaces=module_spaces, as_learner_connector=True))
        pipeline.append(BatchIndividualItems(multi_agent=module_spaces is not None))
        pipeline.append(NumpyToTensor(device=device))
        if gae is not None:
            gamma, lambda_ = gae
            pipeline.prepend(AddOneTsToEpisodesAndTruncate())
            pipeline.append(GeneralAdvantageEstimation(gamma=gamma, lambda_=lambda_))
    return pipeline
