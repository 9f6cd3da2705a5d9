"""The default pipelines: RLlib 2.60's piece order, user hooks and the switch to leave defaults out."""

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.builders import (
    build_env_to_module_pipeline,
    build_learner_pipeline,
    build_module_to_env_pipeline,
)
from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter


def names(pipeline):
    return [c.name for c in pipeline.connectors]


def test_env_to_module_order_with_user_pieces_first(obs_space, act_space):
    hook_args = []

    def hook(observation_space, action_space):
        hook_args.append((observation_space, action_space))
        return [MeanStdFilter()]

    pipeline = build_env_to_module_pipeline(obs_space, act_space, env_to_module_connector=hook)
    assert hook_args == [(obs_space, act_space)]
    assert names(pipeline) == [
        "MeanStdFilter",
        "AddObservationsFromEpisodesToBatch",
        "AddTimeDimToBatchAndZeroPad",
        "AddStatesFromEpisodesToBatch",
        "BatchIndividualItems",
        "NumpyToTensor",
    ]
    assert pipeline["NumpyToTensor"].device == torch.device("cpu")
    assert pipeline.observation_space == gym.spaces.Box(-10.0, 10.0, (2,), np.float32)


def test_module_to_env_order_puts_user_pieces_after_the_unbatching(obs_space, act_space):
    pipeline = build_module_to_env_pipeline(obs_space, act_space, module_to_env_connector=lambda o, a: MeanStdFilter())
    assert names(pipeline) == [
        "GetActions",
        "TensorToNumpy",
        "UnBatchToIndividualItems",
        "RemoveSingleTsTimeRankFromBatch",
        "MeanStdFilter",
        "NormalizeAndClipActions",
        "ListifyDataForVectorEnv",
    ]
    normalize = pipeline["NormalizeAndClipActions"]
    assert normalize.normalize_actions and not normalize.clip_actions


def test_learner_order_with_and_without_gae(obs_space, act_space):
    defaults = [
        "AddObservationsFromEpisodesToBatch",
        "AddColumnsFromEpisodesToTrainBatch",
        "AddTimeDimToBatchAndZeroPad",
        "AddStatesFromEpisodesToBatch",
        "BatchIndividualItems",
        "NumpyToTensor",
    ]
    user = build_learner_pipeline(obs_space, act_space, learner_connector=lambda o, a: FlattenObservations())
    assert names(user) == ["FlattenObservations", *defaults]
    ppo = build_learner_pipeline(obs_space, act_space, gae=(0.99, 0.95))
    assert names(ppo) == ["AddOneTsToEpisodesAndTruncate", *defaults, "GeneralAdvantageEstimation"]
    assert (ppo[-1].gamma, ppo[-1].lambda_) == (0.99, 0.95)


def test_add_default_connectors_false_keeps_only_the_user_pieces(obs_space, act_space):
    for build, hook in (
        (build_env_to_module_pipeline, "env_to_module_connector"),
        (build_module_to_env_pipeline, "module_to_env_connector"),
        (build_learner_pipeline, "learner_connector"),
    ):
        pipeline = build(obs_space, act_space, add_default_connectors=False, **{hook: lambda o, a: MeanStdFilter()})
        assert names(pipeline) == ["MeanStdFilter"]
    assert names(build_env_to_module_pipeline(obs_space, act_space, add_default_connectors=False)) == []
