"""PPO: the clipped-surrogate update of an RLModule on a train batch from the learner pipeline.

Sampling overlaps training, so a batch's actions were chosen by a model one or more versions older than
the one the update starts from (the behaviour policy, whose `action_logp` the inference server recorded).
By default the ratio is taken and clipped against that behaviour policy (RLlib's PPO). With
`proximal_clip` it is decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization";
RLlib's APPO loss): the ratio is clipped around the proximal policy, the module as it was when the update
began (`proximal_action_logp`, computed once per update), and each step's advantage is weighted by
proximal / behaviour (at most 2, as APPO's). Clipping around a behaviour policy some versions back starts
every update with the ratio already off 1, so much of the batch is clipped away before the first step;
SB3's on-policy ratio starts at 1, and so does the proximal one. Without lag both are PPO exactly.
Rows whose `loss_mask` is False (the bootstrap step that AddOneTsToEpisodesAndTruncate adds, and steps
staler than `max_staleness`) do not count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.learner.adam import Adam
from rlgate.models import RLModule
from rlgate.spec.algorithm import PPOConfig

if TYPE_CHECKING:
    from rlgate.learner.data_parallel import Group

#: The most the proximal / behaviour importance weight of a step may be (RLlib APPO's clamp).
MAX_IMPORTANCE_WEIGHT = 2.0
#: The diagnostics `ppo_loss` returns beside the loss, in order.
LOSS_PARTS = ("policy_loss", "vf_loss", "entropy", "kl", "clip_fraction", "explained_variance")


def ppo_loss(module: RLModule, batch: dict[str, torch.Tensor], config: PPOConfig) -> tuple[torch.Tensor, dict]:
    """Total loss of one minibatch, and its parts and diagnostics (clip fraction, explained variance) for logging.

    `config` is one update's (`PPOConfig.at`): its clip_param and entropy_coeff are numbers, not schedules."""
    clip, entropy_coeff = float(config.clip_param), float(config.entropy_coeff)  # type: ignore[arg-type]
    outputs = module.forward_train(batch)
    dist = module.get_train_action_dist_cls().from_logits(outputs[Columns.ACTION_DIST_INPUTS])
    logp = dist.logp(batch[Columns.ACTIONS])
    proximal = batch[Columns.PROXIMAL_ACTION_LOGP]
    log_ratio = logp - proximal
    ratio = torch.exp(log_ratio)
    weight = torch.exp(proximal - batch[Columns.ACTION_LOGP]).clamp(max=MAX_IMPORTANCE_WEIGHT)
    advantages = batch[Columns.ADVANTAGES] * weight
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    values = outputs.get(Columns.VF_PREDS)
    if values is None:  # a train forward that makes none (RLlib's way): the module's value function
        values = module.compute_values(batch)
    vf_error = (values - batch[Columns.VALUE_TARGETS]) ** 2
    vf_loss = vf_error if config.vf_clip_param is None else torch.clamp(vf_error, 0, config.vf_clip_param)
    entropy = dist.entropy()
    mask = batch[Columns.LOSS_MASK]
    count = mask.sum().clamp(min=1)  # once: the masked means below all divide by it

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum() / count

    policy_loss = -mean(surrogate)
    total = policy_loss + config.vf_loss_coeff * mean(vf_loss) - entropy_coeff * mean(entropy)
    with torch.no_grad():
        kl = mean((ratio - 1) - log_ratio)  # the low-variance estimator of KL(proximal || new)
        clip_fraction = mean(((ratio - 1).abs() > clip).float())
        explained = explained_variance(batch[Columns.VALUE_TARGETS], values, mask)
        parts = torch.stack([policy_loss, mean(vf_loss), mean(entropy), kl, clip_fraction, explained])
    return total, dict(zip(LOSS_PARTS, parts.tolist(), strict=True))  # one device-to-host copy, not six


def explained_variance(targets: torch.Tensor, predictions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(targets - predictions) / Var(targets) over the rows in `mask`, at least -1 (RLlib's
    `vf_explained_var`): 1 when the value function predicts the targets, 0 or less when it explains nothing."""
    weights = mask.float()
    count = weights.sum()

    def variance(x: torch.Tensor) -> torch.Tensor:
        centred = x - (x * weights).sum() / count.clamp(min=1)
        return (centred.square() * weights).sum() / (count - 1).clamp(min=1)

    return torch.clamp(1 - variance(targets - predictions) / (variance(targets) + 1e-8), min=-1.0)


def action_logp(module: RLModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log pi(a|s) of the batch's actions under the module as it is now (no gradient)."""
    with torch.no_grad():
        outputs = module.forward_train(batch)
        dist = module.get_train_action_dist_cls().from_logits(outputs[Columns.ACTION_DIST_INPUTS])
        return dist.logp(batch[Columns.ACTIONS])


def ppo_update(
    module: RLModule,
    optimizer: Adam,
    batch: dict[str, torch.Tensor],
    config: PPOConfig,
    rng: np.random.Generator,
    group: Group | None = None,
) -> dict[str, Any]:
    """`num_epochs` passes of minibatch SGD over the batch, with one update's hyper-parameters (`config`, from
    `PPOConfig.at`); returns the mean of each loss part. Each row's PROXIMAL_ACTION_LOGP is the
    module's own before the first step with `proximal_clip`, else the behaviour policy's.

    A stateless module's masked rows (each chunk's bootstrap step, stale steps) are left out first: they
    count for nothing, and with them a batch of `minibatch_size` steps took a second, tiny SGD step per
    epoch (SB3's and cleanrl's minibatches hold only real steps). A stateful module's rows are sequences,
    kept whole.

    In a group of data-parallel learners (`group`), `batch` is this rank's shard: it is cut into as many
    minibatches as one learner cuts the whole batch into, and each step's gradients and loss parts are those of
    the whole minibatch (data_parallel.Group.average)."""
    batch = real_rows(module, batch)
    proximal = action_logp(module, batch) if config.proximal_clip else batch[Columns.ACTION_LOGP]
    batch[Columns.PROXIMAL_ACTION_LOGP] = proximal
    size, device = len(batch[Columns.ADVANTAGES]), batch[Columns.ADVANTAGES].device
    stats: dict[str, list[float]] = {}
    parameters = list(module.parameters())  # once: walking the module for them costs as much as the clip
    module.train()
    for _ in range(config.num_epochs):
        order = torch.from_numpy(rng.permutation(size)).to(device)  # one copy an epoch, not one per column
        if group is None:
            minibatches = order.split(config.minibatch_size)
        else:
            minibatches = order.tensor_split(group.minibatches(config.minibatch_size))
        for rows in minibatches:
            minibatch = {k: _rows(v, rows) for k, v in batch.items()}
            loss, parts = ppo_loss(module, minibatch, config)
            optimizer.zero_grad()
            loss.backward()
            if group is not None:
                parts = group.average(parameters, parts, minibatch[Columns.LOSS_MASK].sum())
            torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip)
            optimizer.step()
            for key, value in parts.items():
                stats.setdefault(key, []).append(value)
    module.eval()
    return {key: float(np.mean(values)) for key, values in stats.items()}


def real_rows(module: RLModule, batch: dict[str, Any]) -> dict[str, Any]:
    """A stateless module's batch without its masked rows (they count for nothing); a stateful one's as it is."""
    if module.is_stateful():
        return batch
    mask = batch[Columns.LOSS_MASK]
    if bool(mask.all()):
        return batch
    rows = mask.nonzero().squeeze(-1)  # once: each column a boolean mask indexes finds them again (a GPU sync each)
    return {key: _rows(value, rows) for key, value in batch.items()}


def _rows(value: Any, rows: torch.Tensor) -> Any:
    """The rows `rows` (indices or a mask) of a batch column: a tensor, or a dict of them, as a stateful module's
    STATE_IN is (and a user's module's Dict observations, which no piece flattened), indexed leaf by leaf."""
    return value[rows] if isinstance(value, torch.Tensor) else map_structure(lambda leaf: leaf[rows], value)
