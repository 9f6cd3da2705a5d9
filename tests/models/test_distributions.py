"""Action distributions against torch.distributions and hand-computed values."""

import math

import pytest
import torch
from torch.distributions import Categorical as TorchCategorical
from torch.distributions import Normal, kl_divergence

from rlgate.models import Categorical, DiagGaussian, MultiCategorical


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_categorical_matches_torch() -> None:
    logits, other = torch.randn(5, 4), torch.randn(5, 4)
    actions = torch.tensor([0, 1, 2, 3, 1])
    dist, ref = Categorical.from_logits(logits), TorchCategorical(logits=logits)
    torch.testing.assert_close(dist.logp(actions), ref.log_prob(actions))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    torch.testing.assert_close(
        dist.kl(Categorical.from_logits(other)), kl_divergence(ref, TorchCategorical(logits=other))
    )


def test_categorical_hand_values() -> None:
    dist = Categorical.from_logits(torch.zeros(2, 4))  # uniform over 4
    torch.testing.assert_close(dist.logp(torch.tensor([0, 3])), torch.full((2,), -math.log(4)))
    torch.testing.assert_close(dist.entropy(), torch.full((2,), math.log(4)))
    torch.testing.assert_close(dist.kl(dist), torch.zeros(2))


def test_categorical_sample_frequencies_follow_softmax() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0])
    samples = Categorical.from_logits(logits.expand(40_000, 3)).sample()
    assert samples.shape == (40_000,) and samples.dtype == torch.int64
    frequencies = torch.bincount(samples, minlength=3).float() / 40_000
    torch.testing.assert_close(frequencies, logits.softmax(-1), atol=0.01, rtol=0)


def test_categorical_masked_logits() -> None:
    dist = Categorical.from_logits(torch.tensor([[0.0, -math.inf, 0.0]]).expand(1000, 3))
    assert not (dist.sample() == 1).any()
    torch.testing.assert_close(dist.entropy(), torch.full((1000,), math.log(2)))
    torch.testing.assert_close(dist.kl(dist), torch.zeros(1000))


def test_categorical_deterministic() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    greedy = Categorical.from_logits(logits).to_deterministic()
    assert greedy.sample().tolist() == [1, 0]
    assert greedy.logp(torch.tensor([1, 0])).shape == (2,)
    assert greedy.to_deterministic() is greedy
    with pytest.raises(NotImplementedError):
        greedy.kl(greedy)


def test_multi_categorical_matches_sum_of_categoricals() -> None:
    dist_cls = MultiCategorical.bind([3, 2])
    logits, other = torch.randn(6, 5), torch.randn(6, 5)
    dist = dist_cls.from_logits(logits)
    actions = dist.sample()
    assert actions.shape == (6, 2)
    assert (actions >= 0).all() and (actions[:, 0] < 3).all() and (actions[:, 1] < 2).all()
    refs = [TorchCategorical(logits=logits[:, :3]), TorchCategorical(logits=logits[:, 3:])]
    others = [TorchCategorical(logits=other[:, :3]), TorchCategorical(logits=other[:, 3:])]
    torch.testing.assert_close(dist.logp(actions), refs[0].log_prob(actions[:, 0]) + refs[1].log_prob(actions[:, 1]))
    torch.testing.assert_close(dist.entropy(), refs[0].entropy() + refs[1].entropy())
    torch.testing.assert_close(
        dist.kl(dist_cls.from_logits(other)),
        kl_divergence(refs[0], others[0]) + kl_divergence(refs[1], others[1]),
    )
    greedy = dist.to_deterministic().sample()
    assert greedy.tolist() == torch.stack([logits[:, :3].argmax(-1), logits[:, 3:].argmax(-1)], -1).tolist()


def test_multi_categorical_needs_nvec() -> None:
    with pytest.raises(TypeError, match="bind"):
        MultiCategorical.from_logits(torch.zeros(1, 5))
    assert MultiCategorical.bind((4, 1)).nvec == (4, 1)


def test_diag_gaussian_matches_torch_normal() -> None:
    mean, log_std = torch.randn(5, 3), torch.randn(5, 3) * 0.5
    other_mean, other_log_std = torch.randn(5, 3), torch.randn(5, 3) * 0.5
    dist = DiagGaussian.from_logits(torch.cat([mean, log_std], -1))
    other = DiagGaussian.from_logits(torch.cat([other_mean, other_log_std], -1))
    ref, ref_other = Normal(mean, log_std.exp()), Normal(other_mean, other_log_std.exp())
    actions = torch.randn(5, 3)
    torch.testing.assert_close(dist.logp(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.kl(other), kl_divergence(ref, ref_other).sum(-1))


def test_diag_gaussian_hand_values_and_sampling() -> None:
    standard = DiagGaussian.from_logits(torch.zeros(1, 4))  # mean 0, std 1, 2-D
    torch.testing.assert_close(standard.logp(torch.zeros(1, 2)), torch.tensor([-math.log(2 * math.pi)]))
    torch.testing.assert_close(standard.entropy(), torch.tensor([1.0 + math.log(2 * math.pi)]))
    logits = torch.tensor([1.0, -2.0, math.log(0.5), math.log(2.0)]).expand(50_000, 4)
    samples = DiagGaussian.from_logits(logits).sample()
    assert samples.shape == (50_000, 2)
    torch.testing.assert_close(samples.mean(0), torch.tensor([1.0, -2.0]), atol=0.05, rtol=0)
    torch.testing.assert_close(samples.std(0), torch.tensor([0.5, 2.0]), atol=0.05, rtol=0)
    greedy = DiagGaussian.from_logits(logits[:2]).to_deterministic()
    assert greedy.sample().tolist() == [[1.0, -2.0], [1.0, -2.0]]
    assert greedy.logp(greedy.sample()).shape == (2,)


def test_logp_and_entropy_carry_gradients() -> None:
    logits = torch.randn(4, 6, requires_grad=True)
    dist = DiagGaussian.from_logits(logits)
    (dist.logp(dist.sample()).sum() + dist.entropy().sum()).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    logits = torch.randn(4, 3, requires_grad=True)
    dist = Categorical.from_logits(logits)
    (dist.logp(dist.sample()).sum() + dist.entropy().sum()).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
