"""SAC's update of one module: twin Q against target networks, the reparameterised actor, and the entropy
temperature alpha tuned towards a target entropy (Haarnoja et al. 2018; RLlib's SACTorchLearner, in SB3's order).

Box actions: the policy's tanh-squashed Gaussian; Q(s, a). Discrete actions (discrete SAC, Christodoulou 2019, as
cleanrl): the expectations over the policy's probabilities replace the sampled actions. Each step: alpha's loss
on the policy's log-probabilities, then the critics' TD loss (both Q networks, the smaller target taken, weighted
by the transitions' importance-sampling `weights`), then the actor's loss against the updated critics (their
parameters left out of its gradient). Returns the absolute TD errors (the mean of the two critics'), the new
priorities. In a group of data-parallel learners, each of the three steps takes the whole batch's gradient
(dqn.optimizer_step).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.learner.adam import Adam
from rlgate.learner.device import module_device
from rlgate.learner.dqn import OFF_POLICY_ADAM_EPS, Stats, optimizer_step, polyak, q_range, td_loss, to_floats
from rlgate.learner.episode_replay_buffer import N_STEP, WEIGHTS
from rlgate.models.distributions import SquashedGaussian
from rlgate.models.sac import Q_NETWORKS, SACModule
from rlgate.spec.algorithm import SACConfig

if TYPE_CHECKING:
    from rlgate.learner.data_parallel import Group

#: cleanrl's discrete SAC: the target entropy is this share of the uniform policy's, log(n).
DISCRETE_TARGET_ENTROPY_SCALE = 0.89


class Temperature(nn.Module):
    """log(alpha), the entropy temperature's logarithm (a module, so checkpoints and snapshots hold it)."""

    def __init__(self, initial_alpha: float, device: torch.device | None = None) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha), device=device))


class SACLearner:
    """One SAC module's target Q networks, temperature, optimizers (policy, both critics, alpha) and update step."""

    def __init__(self, module: SACModule, config: SACConfig) -> None:
        self.module = module
        self.target = copy.deepcopy(module).requires_grad_(False)
        self.temperature = Temperature(config.initial_alpha, module_device(module))  # on the module's device
        if config.target_entropy != "auto":
            self.target_entropy = float(config.target_entropy)
        elif isinstance(module.action_space, gym.spaces.Discrete):  # module.discrete
            self.target_entropy = DISCRETE_TARGET_ENTROPY_SCALE * math.log(module.action_space.n)
        else:
            assert module.action_space.shape is not None  # a 1-D Box
            self.target_entropy = -float(module.action_space.shape[0])
        self._critic = [
            p for name in Q_NETWORKS if getattr(module, name) is not None for p in getattr(module, name).parameters()
        ]
        actor = [*module.pi_encoder.parameters(), *module.pi.parameters()]
        lrs = config.at(0)
        self.optimizers = {
            "policy": Adam(actor, lrs.actor_lr, eps=OFF_POLICY_ADAM_EPS),
            "qf": Adam(self._critic, lrs.critic_lr, eps=OFF_POLICY_ADAM_EPS),
            "alpha": Adam(self.temperature.parameters(), lrs.alpha_lr, eps=OFF_POLICY_ADAM_EPS),
        }
        targets = {name: getattr(self.target, name) for name in Q_NETWORKS if getattr(module, name) is not None}
        self.group: Group | None = None  # the data-parallel learners this one trains with
        self._target_pairs = [
            (p, t)
            for name, target in targets.items()
            for p, t in zip(getattr(module, name).parameters(), target.parameters(), strict=True)
        ]

    def networks(self) -> dict[str, nn.Module]:
        """The learner's own networks (kept in checkpoints, never published)."""
        return {"target": self.target, "temperature": self.temperature}

    def update(self, batch: dict[str, Any], config: SACConfig) -> tuple[dict[str, float], torch.Tensor]:
        """One step of each optimizer on a batch of transitions with one update's learning rates (`SACConfig.at`);
        its diagnostics and the absolute TD errors."""
        for name, lr in (("policy", config.actor_lr), ("qf", config.critic_lr), ("alpha", config.alpha_lr)):
            self.optimizers[name].param_groups[0]["lr"] = lr
        if self.module.discrete:
            return self._update_discrete(batch, config)
        return self._update_continuous(batch, config)

    def _q(self, network: SACModule, obs: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """The smaller of the two Q estimates (the one, without twin Q)."""
        q = network.q_values(obs, actions)
        return torch.min(q, network.q_values(obs, actions, twin=True)) if network.qf_twin is not None else q

    def _critic_step(
        self, batch: dict[str, Any], target: torch.Tensor, q: list[torch.Tensor], config: SACConfig
    ) -> tuple[Stats, torch.Tensor]:
        """Both critics' TD loss against `target` (q: their predictions), one optimizer step; stats, |TD error|."""
        losses = [(batch[WEIGHTS] * td_loss(prediction, target, config.td_error_loss_fn)).mean() for prediction in q]
        # A tensor: q holds one or two predictions.
        td_error = cast(torch.Tensor, sum((prediction - target).detach().abs() for prediction in q) / len(q))
        first = q[0].detach()
        stats: Stats = {"qf_loss": losses[0].detach(), "qf_mean": first.mean(), "td_error_mean": td_error.mean()}
        if len(losses) > 1:
            stats["qf_twin_loss"] = losses[1].detach()
        stats = self._step("qf", 0.5 * sum(losses), config, len(target), stats)
        return stats | q_range(first, self.group), td_error

    def _step(self, name: str, loss: torch.Tensor, config: SACConfig, rows: int, parts: Stats) -> Stats:
        return optimizer_step(self.optimizers[name], loss, config.grad_clip, self.group, rows, parts)

    def _bootstrap(self, batch: dict[str, Any], next_value: torch.Tensor, config: SACConfig) -> torch.Tensor:
        alive = 1.0 - batch[Columns.TERMINATEDS].float()
        return batch[Columns.REWARDS] + config.gamma ** batch[N_STEP].float() * alive * next_value

    def _update_continuous(self, batch: dict[str, Any], config: SACConfig) -> tuple[dict[str, float], torch.Tensor]:
        module, dist_cls = self.module, self.module.get_train_action_dist_cls()
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        both = module.pi(module.pi_encoder(torch.cat([obs, next_obs])))
        logits, next_logits = both.split(len(obs))
        dist = dist_cls.from_logits(logits)
        assert isinstance(dist, SquashedGaussian)  # a Box SAC module's
        actions, logp = dist.rsample_and_logp()
        alpha_loss = -(self.temperature.log_alpha * (logp.detach() + self.target_entropy)).mean()
        rows = len(obs)
        parts: Stats = {"alpha_loss": alpha_loss.detach(), "entropy": -logp.detach().mean()}
        stats = self._step("alpha", alpha_loss, config, rows, parts)
        alpha = self.temperature.log_alpha.detach().exp()
        with torch.no_grad():
            next_dist = dist_cls.from_logits(next_logits.detach())
            assert isinstance(next_dist, SquashedGaussian)
            next_actions, next_logp = next_dist.sample_and_logp()
            next_value = self._q(self.target, next_obs, next_actions) - alpha * next_logp
            target = self._bootstrap(batch, next_value, config)
        taken = batch[Columns.ACTIONS].float()
        q = [module.q_values(obs, taken)] + ([module.q_values(obs, taken, twin=True)] if module.qf_twin else [])
        critic_stats, td_error = self._critic_step(batch, target, q, config)
        for parameter in self._critic:  # the actor's gradient must not reach the critics
            parameter.requires_grad_(False)
        actor_loss = (alpha * logp - self._q(module, obs, actions)).mean()
        stats |= self._step("policy", actor_loss, config, rows, {"policy_loss": actor_loss.detach()})
        for parameter in self._critic:
            parameter.requires_grad_(True)
        return to_floats({**critic_stats, **stats, "alpha": alpha}), td_error

    def _update_discrete(self, batch: dict[str, Any], config: SACConfig) -> tuple[dict[str, float], torch.Tensor]:
        module = self.module
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        both = module.pi(module.pi_encoder(torch.cat([obs, next_obs]))).log_softmax(-1)
        log_probs, next_log_probs = both.split(len(obs))
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1)
        alpha_loss = (self.temperature.log_alpha * (entropy.detach() - self.target_entropy)).mean()
        rows = len(obs)
        parts: Stats = {"alpha_loss": alpha_loss.detach(), "entropy": entropy.detach().mean()}
        stats = self._step("alpha", alpha_loss, config, rows, parts)
        alpha = self.temperature.log_alpha.detach().exp()
        with torch.no_grad():
            next_probs = next_log_probs.exp()
            next_q = self._q(self.target, next_obs) - alpha * next_log_probs
            target = self._bootstrap(batch, (next_probs * next_q).sum(-1), config)
        taken = batch[Columns.ACTIONS].long().unsqueeze(-1)
        q_all = [module.q_values(obs)] + ([module.q_values(obs, twin=True)] if module.qf_twin else [])
        critic_stats, td_error = self._critic_step(
            batch, target, [q.gather(-1, taken).squeeze(-1) for q in q_all], config
        )
        q_min = torch.min(*[q.detach() for q in q_all]) if len(q_all) > 1 else q_all[0].detach()
        actor_loss = (probs * (alpha * log_probs - q_min)).sum(-1).mean()
        stats |= self._step("policy", actor_loss, config, rows, {"policy_loss": actor_loss.detach()})
        return to_floats({**critic_stats, **stats, "alpha": alpha}), td_error

    def update_target(self, tau: float) -> None:
        polyak(self._target_pairs, tau)

    def explore(self, config: SACConfig) -> dict[str, float]:
        """SAC explores by its policy's own entropy: nothing to set."""
        return {}
