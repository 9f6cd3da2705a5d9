"""The env-to-module pieces an exported graph folds in, one file each, and `fold`, which picks a piece's folded form.

A piece folds when what it does to an observation depends only on that observation and on state carried from
step to step: MeanStdFilter (its statistics frozen), FlattenObservations, FrameStackingEnvToModule,
PrevActionsPrevRewards. rlgate's default pieces (they move observations into the batch) need no graph ops. Any
other piece, a user's own above all, is refused by name: `--module-only` exports the module alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgate.connectors import ConnectorV2
from rlgate.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
)
from rlgate.connectors.common.frame_stacking import FrameStacking
from rlgate.connectors.env_to_module import FlattenObservations, MeanStdFilter, PrevActionsPrevRewards
from rlgate.core.errors import UserError
from rlgate.export.folded import Folded
from rlgate.export.pieces.flatten_observations import FoldedFlattenObservations
from rlgate.export.pieces.frame_stacking import FoldedFrameStacking
from rlgate.export.pieces.mean_std_filter import FoldedMeanStdFilter
from rlgate.export.pieces.prev_actions_prev_rewards import FoldedPrevActionsPrevRewards

#: The default pieces: they gather observations and state into the batch, which the graph's inputs already are.
BATCHING = (
    AddObservationsFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
)
FOLDS: dict[type, Callable[[Any, Any], Folded]] = {
    MeanStdFilter: FoldedMeanStdFilter,
    FlattenObservations: FoldedFlattenObservations,
    FrameStacking: FoldedFrameStacking,
    PrevActionsPrevRewards: FoldedPrevActionsPrevRewards,
}


class NotExportable(UserError):
    """A policy part that has no graph form: the message names it and says what to do."""


def fold(pieces: list[ConnectorV2], agent: str | None = None) -> list[Folded]:
    """The folded forms of an env-to-module pipeline's pieces, in order (`agent`: the agent whose observations
    they take, in a multi-agent pipeline); NotExportable for the first piece without one."""
    folded = []
    for i, piece in enumerate(pieces):
        kind = type(piece)
        if kind in BATCHING:
            continue
        if kind not in FOLDS:
            raise NotExportable(
                f"connectors.env_to_module[{i}]: {kind.__name__} cannot be folded into an ONNX graph (rlgate folds "
                f"{', '.join(sorted(k.__name__ for k in FOLDS))}): export the module alone with --module-only and "
                "do what the piece does in your engine"
            )
        if agent is not None and not _applies_to(piece, agent):
            continue
        folded.append(FOLDS[kind](piece, agent))
    return folded


def _applies_to(piece: ConnectorV2, agent: str) -> bool:
    """Whether a multi-agent piece changes this agent's observations (its `agent_ids`, default all)."""
    agent_ids = getattr(piece, "agent_ids", None)
    return agent_ids is None or agent in agent_ids
