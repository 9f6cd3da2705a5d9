"""Connector pipelines (RLlib 2.60's ConnectorV2 API): env -> module, module -> env, episodes -> learner.

A piece is a `ConnectorV2`; a `ConnectorPipelineV2` runs pieces in order and is itself a piece. The
defaults are built by `connectors.builders`; the pieces live in `common/`, `env_to_module/`,
`module_to_env/` and `learner/`, one per file, with RLlib's names, keyword arguments and semantics
(differences are noted in each piece's docstring).

The batched fast path (what the inference server calls, once per batch of B env steps)
--------------------------------------------------------------------------------------
::

    shared_data = {}
    batch = env_to_module(
        rl_module=module, batch={Columns.OBS: obs}, episodes=episodes,
        explore=explore, shared_data=shared_data, metrics=metrics,
    )
    with torch.inference_mode():
        out = module.forward_exploration(batch) if explore else module.forward_inference(batch)
    to_env = module_to_env(
        rl_module=module, batch=out, episodes=episodes,
        explore=explore, shared_data=shared_data, metrics=metrics,   # the same shared_data dict
    )

In:
- `obs`: numpy [B, ...] (for Dict/Tuple spaces a dict/tuple of [B, ...] arrays); row i is the latest
  observation of `episodes[i]`, already in that episode (`add_env_reset` / `add_env_step`). One episode
  per row; rows of all sessions concatenated once.
- `episodes`: any sequence of SingleAgentEpisodes. The server passes an `episodes.rows.EpisodeRows`: its
  sessions store episodes column-wise, and row i's SingleAgentEpisode is built only when a piece asks
  for it (the default pieces on this path never do).
- `explore`: one flag for the whole batch (sample vs greedy; batch sessions with different flags apart).

Env-to-module output: a dict of torch tensors on the pipeline's device: OBS [B, ...] (stateful modules:
[B, 1, ...] plus STATE_IN, a dict of [B, ...]). The default pieces do no per-episode Python work here:
AddObservationsFromEpisodesToBatch leaves the present OBS alone, BatchIndividualItems leaves batched
columns alone and NumpyToTensor converts each column once. Only per-episode data costs a loop over B:
STATE_IN (stateful modules) and the write-back of observation-changing pieces (MeanStdFilter,
FlattenObservations, PrevActionsPrevRewards, ObservationPreprocessor), which transform the batched OBS in
one step and then store row i into episodes[i] (an O(1) set per episode; one batched write into an
`EpisodeRows`).

Module-to-env output: a dict of numpy arrays [B, ...], row i for episodes[i] (the server slices rows
per session):
- ACTIONS: raw actions (what goes into the episode with `add_env_step`);
- ACTIONS_FOR_ENV: the actions for env.step (unsquashed or clipped; always present);
- every other module output, for `add_env_step(..., extra_model_outputs={k: v[i] ...})`: ACTION_LOGP
  (explore only), ACTION_DIST_INPUTS, and STATE_OUT (stateful; a dict of [B, ...] arrays).

How module-to-env knows the batch was batched: BatchIndividualItems writes
`shared_data["memorized_map_structure"]` (the episode id of each row) only when it stacked OBS from
per-episode items. Without it, UnBatchToIndividualItems and ListifyDataForVectorEnv keep every column a
[B, ...] array, and module-to-env user pieces see rows (`foreach_batch_item_change_in_place` and
`single_agent_episode_iterator(zip_with_batch_column=...)` iterate them). With it (the per-episode path,
e.g. `batch={}`), columns are split per episode and stacked back; the output is the same.

Per-episode user pieces (written with `single_agent_episode_iterator`, `add_batch_item`, ...) work in the
same pipelines: in env-to-module each must add exactly one item per episode (BatchIndividualItems stacks
them in episode order and checks the count against the batched OBS).

Episodes that just ended: run env-to-module over them too (their final observation) when the pipeline
has observation-changing pieces, so that the shipped episode holds the transformed final observation;
drop their rows from the module-to-env output.

Timings: with `metrics={}` (a plain dict), each pipeline call adds the seconds spent in each piece to
`metrics[piece class name]`.
"""

from rlgate.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.core.columns import Columns

__all__ = ["Columns", "ConnectorPipelineV2", "ConnectorV2"]
