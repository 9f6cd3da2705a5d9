"""PPO's loss on lagged data: clipped around the behaviour policy by default, around the proximal policy (the
module as the update begins) with `proximal_clip`, where the ratio starts at 1 however far the behaviour lags."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.learner.ppo import action_logp, ppo_loss, ppo_update
from rlgate.models import build_module
from rlgate.spec.build import build_learner_connector
from rlgate.spec.imports import ImportPolicy

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space
ACTION_SPACE = gym.spaces.Discrete(2)
LAG = 0.5  # log pi_now - log pi_behaviour of every step: the behaviour policy chose each action less often


@pytest.fixture
def lagged(learner_settings, cartpole_chunks):
    """loss(proximal_clip, lag) -> (policy-head gradient, stats) of one loss on a real CartPole batch whose
    recorded behaviour log-probabilities are `lag` below the module's own."""
    spec = learner_settings().spec
    torch.manual_seed(0)
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    batch = pipeline(rl_module=module, batch={}, episodes=cartpole_chunks(256), explore=False, shared_data={})
    now = action_logp(module, batch)

    def loss(proximal_clip: bool, lag: float) -> tuple[torch.Tensor, dict]:
        config = spec.algorithm.model_copy(update={"proximal_clip": proximal_clip, "vf_loss_coeff": 0.0})
        rows = {**batch, Columns.ACTION_LOGP: now - lag}
        # What ppo_update sets before its first step.
        rows[Columns.PROXIMAL_ACTION_LOGP] = action_logp(module, rows) if proximal_clip else rows[Columns.ACTION_LOGP]
        module.zero_grad(set_to_none=True)
        total, stats = ppo_loss(module, rows, config.at(0))
        total.backward()
        return torch.cat([p.grad.flatten() for p in module.pi.parameters()]), stats

    return loss


def test_behaviour_clipping_clips_every_lagged_step_before_the_first_sgd_step(lagged):
    _, stats = lagged(proximal_clip=False, lag=LAG)
    assert stats["clip_fraction"] == 1.0  # exp(0.5) = 1.65 > 1.2 on every step


def test_proximal_clipping_starts_at_ratio_one_and_weights_the_onpolicy_gradient(lagged):
    on_policy, _ = lagged(proximal_clip=False, lag=0.0)
    gradient, stats = lagged(proximal_clip=True, lag=LAG)
    assert stats["clip_fraction"] == 0.0
    assert stats["kl"] == pytest.approx(0.0, abs=1e-7)
    # Every step weighted by proximal / behaviour = exp(0.5): the on-policy gradient, scaled.
    assert torch.allclose(gradient, math.exp(LAG) * on_policy, rtol=1e-4, atol=1e-7)
    assert on_policy.abs().max() > 0


def test_proximal_and_behaviour_clipping_agree_without_lag(lagged):
    behaviour, _ = lagged(proximal_clip=False, lag=0.0)
    proximal, _ = lagged(proximal_clip=True, lag=0.0)
    assert torch.allclose(behaviour, proximal, rtol=1e-5, atol=1e-8)


def test_masked_rows_take_no_part_in_the_minibatches(learner_settings, cartpole_chunks):
    """An update on a batch with its masked rows (bootstrap steps) is the update on the real rows alone: the same
    minibatches, so the same weights. With the masked rows among them, a 256-step batch at minibatch_size 256
    took a second SGD step per epoch, and the permutation (so every minibatch) differed."""
    spec = learner_settings().spec
    config = spec.algorithm.model_copy(update={"minibatch_size": 64, "num_epochs": 2})
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    torch.manual_seed(0)
    template = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    batch = pipeline(rl_module=template, batch={}, episodes=cartpole_chunks(256), explore=False, shared_data={})
    mask = batch[Columns.LOSS_MASK].bool()
    assert not mask.all()  # every chunk's bootstrap row
    weights = []
    for rows in (batch, {key: value[mask] for key, value in batch.items()}):
        module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
        module.load_state_dict(template.state_dict())
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        ppo_update(module, optimizer, dict(rows), config.at(0), np.random.default_rng(0))
        weights.append(torch.cat([p.detach().flatten() for p in module.parameters()]))
    assert torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], torch.cat([p.flatten() for p in template.parameters()]))
