"""PPO: the clipped-surrogate update of an RLModule on a train batch from the learner pipeline.

The importance ratio is taken against the behaviour policy's `action_logp`, recorded by the
inference server when it chose each action, so data from slightly older model versions is used
correctly (as in RLlib's PPO/APPO). Rows whose `loss_mask` is False (the bootstrap step that
AddOneTsToEpisodesAndTruncate adds, and steps staler than `max_staleness`) do not count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.models import RLModule
from rlgate.spec.algorithm import PPOConfig


def ppo_loss(
    module: RLModule, batch: dict[str, torch.Tensor], config: PPOConfig, clip: float
) -> tuple[torch.Tensor, dict]:
    """Total loss of one minibatch, and its parts and diagnostics (clip fraction, explained variance) for logging."""
    outputs = module.forward_train(batch)
    dist = module.get_train_action_dist_cls().from_logits(outputs[Columns.ACTION_DIST_INPUTS])
    logp = dist.logp(batch[Columns.ACTIONS])
    log_ratio = logp - batch[Columns.ACTION_LOGP]
    ratio = torch.exp(log_ratio)
    advantages = batch[Columns.ADVANTAGES]
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    vf_error = (outputs[Columns.VF_PREDS] - batch[Columns.VALUE_TARGETS]) ** 2
    vf_loss = vf_error if config.vf_clip_param is None else torch.clamp(vf_error, 0, config.vf_clip_param)
    entropy = dist.entropy()
    mask = batch[Columns.LOSS_MASK]

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum() / mask.sum().clamp(min=1)

    policy_loss = -mean(surrogate)
    total = policy_loss + config.vf_loss_coeff * mean(vf_loss) - config.entropy_coeff * mean(entropy)
    with torch.no_grad():
        kl = mean((ratio - 1) - log_ratio)  # the low-variance estimator of KL(old || new)
        clip_fraction = mean(((ratio - 1).abs() > clip).float())
        explained = explained_variance(batch[Columns.VALUE_TARGETS], outputs[Columns.VF_PREDS], mask)
    return total, {
        "policy_loss": policy_loss.item(),
        "vf_loss": mean(vf_loss).item(),
        "entropy": mean(entropy).item(),
        "kl": kl.item(),
        "clip_fraction": clip_fraction.item(),
        "explained_variance": explained.item(),
    }


def explained_variance(targets: torch.Tensor, predictions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(targets - predictions) / Var(targets) over the rows in `mask`, at least -1 (RLlib's
    `vf_explained_var`): 1 when the value function predicts the targets, 0 or less when it explains nothing."""
    weights = mask.float()
    count = weights.sum()

    def variance(x: torch.Tensor) -> torch.Tensor:
        centred = x - (x * weights).sum() / count.clamp(min=1)
        return (centred.square() * weights).sum() / (count - 1).clamp(min=1)

    return torch.clamp(1 - variance(targets - predictions) / (variance(targets) + 1e-8), min=-1.0)


def ppo_update(
    module: RLModule,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    config: PPOConfig,
    rng: np.random.Generator,
    clip: float,
) -> dict[str, Any]:
    """`num_epochs` passes of minibatch SGD over the batch (ratio clipped at 1 +- `clip`, the clip_param
    schedule's value now); returns the mean of each loss part."""
    size = len(batch[Columns.ADVANTAGES])
    stats: dict[str, list[float]] = {}
    module.train()
    for _ in range(config.num_epochs):
        order = torch.from_numpy(rng.permutation(size))
        for start in range(0, size, config.minibatch_size):
            rows = order[start : start + config.minibatch_size]
            minibatch = {k: v[rows] for k, v in batch.items()}
            loss, parts = ppo_loss(module, minibatch, config, clip)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
            optimizer.step()
            for key, value in parts.items():
                stats.setdefault(key, []).append(value)
    module.eval()
    return {key: float(np.mean(values)) for key, values in stats.items()}
