"""DQN's update of one module: the TD loss against a target network (double Q, n-step), RLlib's DQNTorchLearner.

The target of a transition is `r + gamma^n (1 - terminated) Q_target(s', a*)`, where `r` is the n steps'
discounted reward sum, `n` the steps the transition spans (its `n_step` column) and `a*` the trained network's
greedy action in `s'` with `double_q` (the target network's own otherwise). The loss weighs each transition by its
importance-sampling `weights` (prioritized replay) and returns the absolute TD errors, the new priorities.

In a group of data-parallel learners (`group`, data_parallel.Group), the batch is this rank's shard, and each
optimizer step takes the whole batch's gradient: every rank's, weighted by its rows (`optimizer_step`).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from rlgate.core.columns import Columns
from rlgate.learner.adam import Adam
from rlgate.learner.episode_replay_buffer import N_STEP, WEIGHTS
from rlgate.models.dqn import DQNModule
from rlgate.spec.algorithm import DQNConfig

if TYPE_CHECKING:
    from rlgate.learner.data_parallel import Group

#: Adam's epsilon for DQN and SAC (torch's default, which SB3 and RLlib's DQN keep).
OFF_POLICY_ADAM_EPS = 1e-8


def td_loss(predicted: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Per transition: huber (smooth L1, delta 1, RLlib's and SB3's DQN loss) or squared error of the TD error."""
    if kind == "huber":
        return F.smooth_l1_loss(predicted, target, reduction="none")
    return F.mse_loss(predicted, target, reduction="none")


def polyak(pairs: list[tuple[torch.Tensor, torch.Tensor]], tau: float) -> None:
    """Move each target tensor `tau` of the way to its trained one (tau 1: a copy)."""
    with torch.no_grad():
        targets, sources = [t for _, t in pairs], [s for s, _ in pairs]
        torch._foreach_lerp_(targets, sources, tau)


#: An update's diagnostics while it runs: 0-d tensors on the learner's device until `to_floats` reads them all.
Stats = dict[str, torch.Tensor | float]


def to_floats(stats: Stats) -> dict[str, float]:
    """The stats as numbers, in their order: the tensors among them copied to the host together (one device sync
    for an update's diagnostics, not one each)."""
    tensors = {key: value for key, value in stats.items() if isinstance(value, torch.Tensor)}
    copied = dict(zip(tensors, torch.stack(list(tensors.values())).tolist(), strict=True)) if tensors else {}
    return {key: copied.get(key, value) for key, value in stats.items()}


def optimizer_step(
    optimizer: Adam,
    loss: torch.Tensor,
    grad_clip: float | None,
    group: Group | None,
    rows: int,
    parts: Stats,
) -> Stats:
    """One step of `optimizer` on `loss`, a mean over `rows` transitions, its gradients clipped to `grad_clip`;
    returns the loss's `parts` (means over the same rows, detached) as they are. In a group of data-parallel
    learners, the gradients and parts are first averaged over every rank's shard, each weighted by its rows: the
    whole batch's (numbers then)."""
    optimizer.zero_grad()
    loss.backward()
    parameters = optimizer.param_groups[0]["params"]
    if group is not None:
        parts = dict(group.average(parameters, to_floats(parts), rows))
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    optimizer.step()
    return parts


def q_range(q: torch.Tensor, group: Group | None) -> Stats:
    """The batch's largest and smallest Q value (qf_max, qf_min); in a group of data-parallel learners, over
    every rank's shard."""
    extremes: Stats = {"qf_max": q.max(), "qf_min": q.min()}
    if group is None:
        return extremes
    return dict(group.extremes(to_floats(extremes), largest=("qf_max",), smallest=("qf_min",)))


class DQNLearner:
    """One DQN module's target network, optimizer and update step."""

    def __init__(self, module: DQNModule, config: DQNConfig) -> None:
        self.module = module
        self.target = copy.deepcopy(module).requires_grad_(False)
        self.optimizers = {"qf": Adam(module.parameters(), config.at(0).lr, eps=OFF_POLICY_ADAM_EPS)}
        self.group: Group | None = None  # the data-parallel learners this one trains with

    def networks(self) -> dict[str, torch.nn.Module]:
        """The learner's own networks (kept in checkpoints, never published)."""
        return {"target": self.target}

    def update(self, batch: dict[str, Any], config: DQNConfig) -> tuple[dict[str, float], torch.Tensor]:
        """One gradient step on a batch of transitions with one update's hyper-parameters (`DQNConfig.at`); its
        diagnostics and the absolute TD errors."""
        self.optimizers["qf"].param_groups[0]["lr"] = config.lr
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        if config.double_q:  # one forward for both (RLlib's): the greedy next actions come from the trained network
            q_both = self.module.compute_q_values({Columns.OBS: torch.cat([obs, next_obs])})
            q, q_next = q_both.split(len(obs))
        else:
            q, q_next = self.module.compute_q_values({Columns.OBS: obs}), None
        chosen = q.gather(-1, batch[Columns.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            q_target = self.target.compute_q_values({Columns.OBS: next_obs})
            best = (q_next if q_next is not None else q_target).argmax(-1, keepdim=True)
            bootstrap = q_target.gather(-1, best).squeeze(-1) * (1.0 - batch[Columns.TERMINATEDS].float())
            target = batch[Columns.REWARDS] + config.gamma ** batch[N_STEP].float() * bootstrap
        loss = (batch[WEIGHTS] * td_loss(chosen, target, config.td_error_loss_fn)).mean()
        td_error = (chosen - target).detach().abs()
        stats: Stats = {"qf_loss": loss.detach(), "qf_mean": chosen.detach().mean(), "td_error_mean": td_error.mean()}
        stats = optimizer_step(self.optimizers["qf"], loss, config.grad_clip, self.group, len(chosen), stats)
        return to_floats(stats | q_range(chosen.detach(), self.group)), td_error

    def update_target(self, tau: float) -> None:
        polyak(list(zip(self.module.parameters(), self.target.parameters(), strict=True)), tau)

    def explore(self, config: DQNConfig) -> dict[str, float]:
        """Set the module's epsilon to the schedule's value now (it goes out with the weights)."""
        assert not isinstance(config.epsilon, list)  # a config at a step (`at`): the schedule's value
        self.module.epsilon.fill_(float(config.epsilon))
        return {"epsilon": float(config.epsilon)}
