"""GetActions: actions sampled from the module's action distribution inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_rl_module
from rlgate.core.columns import Columns

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


class GetActions(ConnectorV2):
    """Write ACTIONS (and, when exploring, ACTION_LOGP) from ACTION_DIST_INPUTS, unless ACTIONS exist.

    Exploring: a sample of the module's exploration distribution. Otherwise: the deterministic (greedy)
    action of its inference distribution. Works on the whole [B, ...] tensor at once; for a MultiRLModule, on
    each module's outputs with that module's distribution.

    RLlib 2.60 also writes ACTION_LOGP when not exploring: its deterministic distribution's logp,
    `zeros_like(actions)` (an int64 0 per Discrete action), which is no log-probability. Here (a deliberate
    difference) it is not written, so a greedy session's episodes hold no made-up ACTION_LOGP.
    """

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
        assert rl_module is not None  # module-to-env runs after the module's forward
        if is_multi_rl_module(rl_module):
            for module_id, module_outputs in batch.items():
                _get_actions(module_outputs, rl_module[module_id], explore)
        else:
            _get_actions(batch, rl_module, explore)
        return batch


def _get_actions(batch: dict[str, Any], rl_module: RLModule, explore: bool | None) -> None:
    if Columns.ACTIONS in batch or Columns.ACTION_DIST_INPUTS not in batch:
        return
    if explore:
        dist = rl_module.get_exploration_action_dist_cls().from_logits(batch[Columns.ACTION_DIST_INPUTS])
        batch[Columns.ACTIONS], logp = dist.sample_and_logp()
        batch.setdefault(Columns.ACTION_LOGP, logp)
    else:
        dist = rl_module.get_inference_action_dist_cls().from_logits(batch[Columns.ACTION_DIST_INPUTS])
        batch[Columns.ACTIONS] = dist.to_deterministic().sample()
