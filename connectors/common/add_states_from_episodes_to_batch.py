"""AddStatesFromEpisodesToBatch: STATE_IN for a stateful module, from the episodes' STATE_OUT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlgate.connectors.batching import batch_items
from rlgate.connectors.common.tensor_to_numpy import to_numpy
from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_rl_module
from rlgate.connectors.zero_padding import num_sequences
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class AddStatesFromEpisodesToBatch(ConnectorV2):
    """Add STATE_IN when the module is stateful (a no-op otherwise, or when STATE_IN is there already).

    Env-to-module: per episode, the STATE_OUT of its latest step, or the module's initial state when the
    episode has just started (or has no STATE_OUT yet).
    Learner: per zero-padded sequence (of `max_seq_len` steps), the state the module had before the
    sequence's first step: the STATE_OUT of the step before it (for the first sequence of a chunk, from the
    lookback buffer; the initial state when the episode starts at t=0).
    Multi-agent: each agent's episode with its own module's state (agents of stateless modules add none).
    """

    accepts_batched_obs = True

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if rl_module is None or not rl_module.is_stateful() or Columns.STATE_IN in batch:
            return batch
        learner = self._as_learner_connector
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=not learner):
            module = rl_module[episode.module_id] if is_multi_rl_module(rl_module) else rl_module
            if not module.is_stateful():
                continue
            initial_state = to_numpy(module.get_initial_state())
            has_state_out = Columns.STATE_OUT in episode.extra_model_outputs
            if learner:
                max_seq_len = module.model_config["max_seq_len"]
                states_in = _sequence_start_states(episode, initial_state, max_seq_len, has_state_out)
                num_items = num_sequences(len(episode), max_seq_len)
                self.add_n_batch_items(batch, Columns.STATE_IN, states_in, num_items, episode)
            else:
                just_started = episode.t_started == 0 and len(episode) == 0
                state = (
                    initial_state
                    if just_started or not has_state_out
                    else episode.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=len(episode) == 0)
                )
                self.add_batch_item(batch, Columns.STATE_IN, state, episode)
        return batch


def _sequence_start_states(
    episode: SingleAgentEpisode, initial_state: Any, max_seq_len: int, has_state_out: bool
) -> Any:
    """The state before each step, taken at every `max_seq_len`-th step: [num sequences, ...] (nested)."""
    if episode.t_started == 0 or not has_state_out:
        before_first = initial_state
    else:
        before_first = episode.get_extra_model_outputs(Columns.STATE_OUT, -1, neg_index_as_lookback=True)
    if not has_state_out:
        return map_structure(lambda s: np.repeat(s[None], num_sequences(len(episode), max_seq_len), 0), before_first)
    state_outs = episode.get_extra_model_outputs(Columns.STATE_OUT, slice(0, len(episode)))
    if isinstance(state_outs, list):
        state_outs = batch_items(state_outs)
    return map_structure(
        lambda first, outs: np.concatenate([np.asarray(first)[None], outs[:-1]])[::max_seq_len],
        before_first,
        state_outs,
    )
