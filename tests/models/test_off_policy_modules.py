"""DQN's and SAC's default modules and SAC's squashed Gaussian: what they act with and what they compute."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.models import DQNModule, ModelConfig, SACModule, SquashedGaussian
from rlgate.models.catalog import UnsupportedSpace
from rlgate.models.weights import load_weights, weights_to_bytes

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
CONFIG = ModelConfig(fcnet_hiddens=(16,))


def observations(n: int = 256) -> dict[str, torch.Tensor]:
    return {Columns.OBS: torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (n, 4)).astype(np.float32))}


def test_dqn_acts_greedily_for_inference_and_epsilon_greedily_when_exploring() -> None:
    torch.manual_seed(0)
    module = DQNModule(OBS, gym.spaces.Discrete(3), CONFIG, epsilon=0.0)
    batch = observations()
    greedy = module.compute_q_values(batch).argmax(-1)
    assert torch.equal(module.forward_inference(batch)[Columns.ACTIONS], greedy)
    assert torch.equal(module.forward_exploration(batch)[Columns.ACTIONS], greedy)  # epsilon 0: greedy
    module.epsilon.fill_(1.0)
    random = torch.cat([module.forward_exploration(batch)[Columns.ACTIONS] for _ in range(20)])
    shares = torch.bincount(random, minlength=3).float() / len(random)
    assert torch.allclose(shares, torch.full((3,), 1 / 3), atol=0.03)  # uniform, not the greedy action's


def test_dqn_epsilon_travels_with_the_weights_and_dueling_centres_the_advantages() -> None:
    learner_side = DQNModule(OBS, gym.spaces.Discrete(3), CONFIG, dueling=True, epsilon=1.0)
    learner_side.epsilon.fill_(0.25)
    server_side = DQNModule(OBS, gym.spaces.Discrete(3), CONFIG, dueling=True, epsilon=1.0)
    load_weights(server_side, weights_to_bytes(learner_side))
    assert float(server_side.epsilon) == 0.25
    batch = observations(8)
    features = learner_side.encoder(batch[Columns.OBS])
    advantages, value = learner_side.af(features), learner_side.vf(features)
    expected = value + advantages - advantages.mean(-1, keepdim=True)
    assert torch.allclose(learner_side.compute_q_values(batch), expected)
    assert torch.allclose(learner_side.compute_values(batch), expected.max(-1).values)


def test_dqn_takes_discrete_actions_only() -> None:
    with pytest.raises(UnsupportedSpace, match="DQN takes Discrete actions"):
        DQNModule(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), CONFIG)
    assert DQNModule.action_space_misfit(gym.spaces.Discrete(2)) is None


def test_squashed_gaussian_matches_torch_tanh_transformed_normal() -> None:
    torch.manual_seed(1)
    logits = torch.randn(64, 4)
    dist = SquashedGaussian.from_logits(logits)
    actions, logp = dist.rsample_and_logp()
    assert actions.abs().max() <= 1.0
    mean, log_std = logits.chunk(2, -1)
    reference = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp()), [torch.distributions.TanhTransform()]
    )
    inside = (actions.abs() < 0.999).all(-1)  # saturated float32 tanh loses the sample; logp keeps it exact
    assert inside.sum() > 40
    assert torch.allclose(logp[inside], reference.log_prob(actions).sum(-1)[inside], atol=1e-3)
    assert torch.allclose(dist.logp(actions)[inside], logp[inside], atol=1e-3)
    assert torch.equal(dist.to_deterministic().sample(), torch.tanh(mean))
    logits.requires_grad_(True)
    sampled, _ = SquashedGaussian.from_logits(logits).rsample_and_logp()
    sampled.sum().backward()  # reparameterised: the sample's gradient reaches the mean and log std
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with pytest.raises(NotImplementedError):
        dist.entropy()


def test_a_squashed_gaussian_samples_in_two_steps_as_getactions_and_an_exported_graph_do() -> None:
    """sample() is sample_from(noise()): tanh of the Gaussian's draw, so a graph given the same noise samples the
    same action; noise of zeros gives the greedy one. sample_and_logp (GetActions') draws the same action and
    takes its log-probability from the draw itself, exact where tanh saturates and atanh of the action is not."""
    logits = 3.0 * torch.randn(256, 4, generator=torch.Generator().manual_seed(3))
    dist = SquashedGaussian.from_logits(logits)
    torch.manual_seed(4)
    sampled = dist.sample()
    torch.manual_seed(4)
    noise = dist.noise()
    assert torch.equal(dist.sample_from(noise), sampled) and sampled.abs().max() <= 1.0
    assert torch.equal(dist.sample_from(torch.zeros(256, 2)), dist.to_deterministic().sample())
    torch.manual_seed(4)
    actions, logp = dist.sample_and_logp()
    assert torch.equal(actions, sampled)
    exact = SquashedGaussian.from_logits(logits.double()).sample_and_logp_from(noise.double())[1]
    torch.testing.assert_close(logp.double(), exact, rtol=1e-5, atol=1e-4)
    saturated = (sampled.abs() > 0.9999).any(-1)
    assert saturated.sum() > 10
    assert ((dist.logp(sampled).double() - exact)[saturated].abs() > 0.1).any()  # atanh of the action loses it


def test_sac_module_acts_with_its_policy_and_has_twin_q_networks() -> None:
    torch.manual_seed(2)
    box = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    module = SACModule(OBS, box, CONFIG)
    batch = observations(32)
    outputs = module.forward_exploration(batch)
    assert set(outputs) == {Columns.ACTION_DIST_INPUTS} and outputs[Columns.ACTION_DIST_INPUTS].shape == (32, 4)
    assert module.get_exploration_action_dist_cls() is SquashedGaussian
    actions = torch.zeros(32, 2)
    q, twin = module.q_values(batch[Columns.OBS], actions), module.q_values(batch[Columns.OBS], actions, twin=True)
    assert q.shape == twin.shape == (32,) and not torch.equal(q, twin)
    discrete = SACModule(OBS, gym.spaces.Discrete(5), CONFIG, twin_q=False)
    assert discrete.q_values(batch[Columns.OBS]).shape == (32, 5) and discrete.qf_twin is None
    assert discrete.forward_inference(batch)[Columns.ACTION_DIST_INPUTS].shape == (32, 5)
    with pytest.raises(UnsupportedSpace, match="bounded 1-D float Box or a Discrete"):
        SACModule(OBS, gym.spaces.MultiDiscrete([2, 2]), CONFIG)
    with pytest.raises(UnsupportedSpace, match="1-D Box observations"):
        SACModule(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), box, CONFIG)
