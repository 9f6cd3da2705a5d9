"""The pipelines of a policy: which connector pieces run for given env spaces, on the server and the learner."""

from __future__ import annotations

import gymnasium as gym

from rlgate.connectors import ConnectorPipelineV2
from rlgate.connectors.builders import build_env_to_module_pipeline
from rlgate.connectors.env_to_module.flatten_observations import FlattenObservations
from rlgate.connectors.env_to_module.mean_std_filter import MeanStdFilter
from rlgate.models.catalog import encodes


def build_env_to_module(
    observation_space: gym.Space, action_space: gym.Space, *, mean_std_filter: bool = False, device: str = "cpu"
) -> ConnectorPipelineV2:
    """The default env-to-module pipeline; its output observation space is the module's.

    Observations the default encoders cannot take as they are (Dict, Tuple, Discrete, ...) are
    flattened by a FlattenObservations piece first, so every gymnasium space works out of the box.
    `mean_std_filter` adds a MeanStdFilter (after flattening), whose statistics the learner merges
    across servers. The learner builds its module (and its statistics coordinator) through this too,
    so both sides agree on the module's spaces and on the pieces that carry state.
    """

    def user_pieces(obs: gym.Space, _act: gym.Space) -> list:
        pieces: list = [] if encodes(obs) else [FlattenObservations()]
        return [*pieces, MeanStdFilter()] if mean_std_filter else pieces

    return build_env_to_module_pipeline(
        observation_space, action_space, env_to_module_connector=user_pieces, device=device
    )
