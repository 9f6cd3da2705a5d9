"""Action distributions built from a module's ACTION_DIST_INPUTS (RLlib's TorchDistribution API).

Written with plain tensor ops rather than torch.distributions: sampling and logp run per batch on the
inference server's hot path, where torch.distributions' argument handling costs more than the math.

Categorical, MultiCategorical and DiagGaussian sample in two steps: `noise()` draws the random numbers from
torch's generator, `sample_from(noise)` turns them into actions with tensor ops alone. An exported ONNX graph
takes the noise as an input and runs `sample_from`, so an engine that draws the same noise gets the same action
(docs/onnx.md).
"""

import abc
import math
from typing import Self

import torch

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_MIN_LOG = torch.finfo(torch.float32).min


class Distribution(abc.ABC):
    """A batch of action distributions; `D.from_logits(logits)` builds one from a module's outputs."""

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> "Distribution":
        return cls(logits)  # type: ignore[call-arg]  # each concrete distribution takes its logits

    @abc.abstractmethod
    def sample(self) -> torch.Tensor: ...

    @abc.abstractmethod
    def logp(self, actions: torch.Tensor) -> torch.Tensor: ...

    def sample_and_logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A sample and its log-probability (GetActions' exploring step). A distribution whose logp of its own
        sample loses precision (SquashedGaussian's atanh of a saturated tanh) overrides it with the draw's exact one."""
        actions = self.sample()
        return actions, self.logp(actions)

    def sample_and_logp_from(self, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample_and_logp` from given noise, for the distributions that sample in two steps (`sample_from`):
        what an exported graph computes."""
        actions = self.sample_from(noise)  # type: ignore[attr-defined]
        return actions, self.logp(actions)

    @abc.abstractmethod
    def entropy(self) -> torch.Tensor: ...

    @abc.abstractmethod
    def kl(self, other: Self) -> torch.Tensor: ...

    @abc.abstractmethod
    def to_deterministic(self) -> "Deterministic":
        """The distribution whose sample() is this one's greedy action."""


class Deterministic(Distribution):
    """Always samples `loc`; logp and entropy are float zeros over the batch shape.

    RLlib's TorchDeterministic differs: its logp is `zeros_like(loc)` (int64 for a categorical's argmax,
    [..., d] for a DiagGaussian's mean) and its entropy raises RuntimeError.
    """

    def __init__(self, loc: torch.Tensor, event_ndim: int = 0) -> None:
        self.loc = loc
        self._batch_shape = loc.shape[: loc.dim() - event_ndim]

    def sample(self) -> torch.Tensor:
        return self.loc.detach().clone()

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self._batch_shape, device=self.loc.device)

    def entropy(self) -> torch.Tensor:
        return torch.zeros(self._batch_shape, device=self.loc.device)

    def kl(self, other: Distribution) -> torch.Tensor:
        raise NotImplementedError("kl() is not defined for a Deterministic distribution")

    def to_deterministic(self) -> "Deterministic":
        return self


class Categorical(Distribution):
    """Discrete actions: logits [..., n] -> integer actions [...]."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self._log_probs: torch.Tensor | None = None

    @property
    def log_probs(self) -> torch.Tensor:
        """log_softmax(logits), computed once (a plain attribute: functools.cached_property takes a lock)."""
        if self._log_probs is None:
            self._log_probs = self.logits.log_softmax(-1)
        return self._log_probs

    def sample(self) -> torch.Tensor:
        return self.sample_from(self.noise())

    def noise(self) -> torch.Tensor:
        """One Exponential(1) draw per logit: what `sample_from` takes."""
        return torch.empty_like(self.logits).exponential_()

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """Gumbel-max: argmax(logits + Gumbel noise), with Gumbel = -log(Exponential(1)). About 5x cheaper than
        torch.distributions.Categorical.sample() on a small batch. Noise of ones gives the greedy action."""
        return (self.logits - noise.log()).argmax(-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        index = actions if actions.dtype == torch.int64 else actions.long()
        return self.log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        log_probs = self.log_probs.clamp(min=_MIN_LOG)  # 0 * log(0) must give 0, not NaN
        return -(log_probs.exp() * log_probs).sum(-1)

    def kl(self, other: "Categorical") -> torch.Tensor:
        """KL(self || other) from clamped log-probabilities: where `other` gives an action probability 0 (a
        -inf logit, as action masking makes) and this one does not, RLlib's (torch.distributions') is inf; here
        it stays finite (huge), so a KL loss term does not turn the loss into inf/NaN."""
        log_p, log_q = self.log_probs.clamp(min=_MIN_LOG), other.log_probs.clamp(min=_MIN_LOG)
        return (log_p.exp() * (log_p - log_q)).sum(-1)

    def to_deterministic(self) -> Deterministic:
        return Deterministic(self.logits.argmax(-1))


class MultiCategorical(Distribution):
    """MultiDiscrete actions: independent Categoricals over consecutive slices of the logits.

    The class is bound to an nvec first (`MultiCategorical.bind(space.nvec)`), so that the bound
    class, like the others, is built by `from_logits(logits)` alone. Actions are [..., len(nvec)].
    """

    nvec: tuple[int, ...] = ()

    @classmethod
    def bind(cls, nvec: "list[int] | tuple[int, ...]") -> type["MultiCategorical"]:
        """Return a MultiCategorical class for this nvec (the logits split into these sizes)."""
        nvec = tuple(int(n) for n in nvec)
        return type(f"MultiCategorical{list(nvec)}", (cls,), {"nvec": nvec})

    def __init__(self, logits: torch.Tensor) -> None:
        if not self.nvec:
            raise TypeError("MultiCategorical needs an nvec: use MultiCategorical.bind(nvec).from_logits()")
        self.logits = logits
        self._cats = [Categorical(part) for part in logits.split(self.nvec, dim=-1)]

    def sample(self) -> torch.Tensor:
        return self.sample_from(self.noise())

    def noise(self) -> torch.Tensor:
        """One Exponential(1) draw per logit, all parts' in one tensor: what `sample_from` takes."""
        return torch.empty_like(self.logits).exponential_()

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """Each part's Gumbel-max (Categorical.sample_from) with its slice of the noise."""
        parts = noise.split(self.nvec, dim=-1)
        return torch.stack([cat.sample_from(part) for cat, part in zip(self._cats, parts, strict=True)], dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return sum(cat.logp(a) for cat, a in zip(self._cats, actions.unbind(-1), strict=True))  # type: ignore[return-value]  # of one tensor or more: never sum's 0

    def entropy(self) -> torch.Tensor:
        return sum(cat.entropy() for cat in self._cats)  # type: ignore[return-value]  # of one tensor or more: never sum's 0

    def kl(self, other: "MultiCategorical") -> torch.Tensor:
        return sum(cat.kl(o) for cat, o in zip(self._cats, other._cats, strict=True))  # type: ignore[return-value]  # of one tensor or more: never sum's 0

    def to_deterministic(self) -> Deterministic:
        return Deterministic(torch.stack([cat.logits.argmax(-1) for cat in self._cats], dim=-1), 1)


class DiagGaussian(Distribution):
    """Box actions: logits = concat(mean, log_std) [..., 2d] -> actions [..., d] (unsquashed).

    The Normal's formulas are written out: half the cost of torch.distributions.Normal per call.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        self.mean, self.log_std = logits.chunk(2, dim=-1)
        self.std = self.log_std.exp()

    def sample(self) -> torch.Tensor:
        return self.sample_from(self.noise())

    def noise(self) -> torch.Tensor:
        """One standard normal draw per action dimension: what `sample_from` takes."""
        return torch.randn_like(self.mean)

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """mean + std * noise (noise of zeros gives the mean, the greedy action)."""
        return (self.mean + self.std * noise).detach()

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + _HALF_LOG_2PI + self.log_std).sum(-1)

    def kl(self, other: "DiagGaussian") -> torch.Tensor:
        var_ratio = (self.std / other.std) ** 2
        mean_term = ((self.mean - other.mean) / other.std) ** 2
        return (0.5 * (var_ratio + mean_term - 1.0) - self.log_std + other.log_std).sum(-1)

    def to_deterministic(self) -> Deterministic:
        return Deterministic(self.mean, 1)


#: The range a SquashedGaussian's log std is clamped to (RLlib's MIN_LOG_NN_OUTPUT, MAX_LOG_NN_OUTPUT).
SQUASHED_LOG_STD_RANGE = (-5.0, 2.0)
_ATANH_LIMIT = 1.0 - 1e-6  # RLlib's SMALL_NUMBER off +-1: atanh stays finite for actions at the bounds


class SquashedGaussian(DiagGaussian):
    """Box actions in [-1, 1]: tanh of a Gaussian (SAC's policy; RLlib's TorchSquashedGaussian with low -1, high 1).

    logits = concat(mean, log_std) [..., 2d], the log std clamped to SQUASHED_LOG_STD_RANGE. The module-to-env
    pipeline's NormalizeAndClipActions maps the actions from [-1, 1] to the env's bounds, as for RLlib's SAC.
    `rsample_and_logp` (reparameterised, for the actor loss) and `sample_and_logp` give the exact log-probability of
    the pre-squash sample; `logp` of given actions takes their atanh first.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__(logits)
        self.log_std = self.log_std.clamp(*SQUASHED_LOG_STD_RANGE)
        self.std = self.log_std.exp()

    def sample_from(self, noise: torch.Tensor) -> torch.Tensor:
        """tanh(mean + std * noise): the Gaussian's draw squashed (noise of zeros gives the greedy action)."""
        return torch.tanh(super().sample_from(noise))

    def rsample_and_logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample (gradients flow into mean and log std) and its log-probability."""
        unsquashed = self.mean + self.std * self.noise()
        return torch.tanh(unsquashed), self._squashed_logp(unsquashed)

    def sample_and_logp(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample()`'s draw (the same noise) and the exact log-probability of its pre-squash value."""
        return self.sample_and_logp_from(self.noise())

    def sample_and_logp_from(self, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tanh(u) and log p from u = mean + std * noise itself: logp(tanh(u)) would take atanh of a float32 tanh,
        whose slope 1 / (1 - |a|) magnifies a rounding of the action a hundredfold and more as tanh saturates."""
        unsquashed = (self.mean + self.std * noise).detach()
        return torch.tanh(unsquashed), self._squashed_logp(unsquashed).detach()

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return self._squashed_logp(torch.atanh(actions.clamp(-_ATANH_LIMIT, _ATANH_LIMIT)))

    def _squashed_logp(self, unsquashed: torch.Tensor) -> torch.Tensor:
        """log N(u) - sum log(1 - tanh(u)^2), the latter as 2 (log 2 - u - softplus(-2u)) (stable, RLlib's)."""
        log_det = 2.0 * (math.log(2.0) - unsquashed - torch.nn.functional.softplus(-2.0 * unsquashed))
        return super().logp(unsquashed) - log_det.sum(-1)

    def entropy(self) -> torch.Tensor:
        raise NotImplementedError("a SquashedGaussian has no closed-form entropy (as RLlib's); use -logp of samples")

    def kl(self, other: Distribution) -> torch.Tensor:
        raise NotImplementedError("a SquashedGaussian has no closed-form KL (as RLlib's)")

    def to_deterministic(self) -> Deterministic:
        return Deterministic(torch.tanh(self.mean), 1)
