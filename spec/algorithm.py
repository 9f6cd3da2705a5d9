"""The algorithm's hyper-parameters: PPO (the only algorithm so far), each declared and documented once."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

#: A value that changes over training: [[env_steps, value], ...], linear in between and constant after the last
#: point (RLlib's schedule format), e.g. [[0, 1e-3], [100000, 0.0]] for SB3's "lin_1e-3" over 100k steps.
Schedule = Annotated[list[tuple[Annotated[int, Field(ge=0)], float]], Field(min_length=1)]


#: The fields that take a schedule.
SCHEDULED = ("lr", "clip_param", "entropy_coeff")


def scheduled(value: float | list[tuple[int, float]], env_steps: int) -> float:
    """The value of a constant, or of a schedule after `env_steps` env steps trained."""
    if isinstance(value, int | float):
        return float(value)
    import numpy as np  # here: `rlgate up` reads specs before it starts its processes, and needs no numpy

    steps, values = zip(*value, strict=True)
    return float(np.interp(env_steps, steps, values))


class PPOConfig(BaseModel):
    """PPO's hyper-parameters, each declared (with its default) only here; the `[algorithm]` of a run spec.

    The defaults are rl-zoo's CartPole-v1 settings (gamma 0.98, lambda 0.8, 20 epochs, lr 1e-3), which
    learn in tens of thousands of env steps. Every field is a flag (`--spec.algorithm.lr 3e-4`); `lr`,
    `clip_param` and `entropy_coeff` also take a schedule over env steps trained (`lr = [[0, 1e-3], [100000, 0]]`),
    as RLlib's do; `at(env_steps)` gives their values for one update.
    """

    model_config = ConfigDict(extra="forbid")

    train_batch_size: int = Field(512, ge=1, description="Env steps per PPO update.")
    minibatch_size: int = Field(128, ge=1, description="Env steps per SGD minibatch.")
    num_epochs: int = Field(20, ge=1, description="Passes of SGD over each train batch.")
    lr: float | Schedule = Field(1e-3, description="Adam learning rate, or a schedule of it.")
    gamma: float = Field(0.98, gt=0, le=1, description="Discount factor.")
    lambda_: float = Field(
        0.8,
        ge=0,
        le=1,
        # RLlib's name is `lambda_` (`lambda` is Python's keyword); a file or flag may say either
        # (`--spec.algorithm.lambda 0.95`, `lambda = 0.95`).
        validation_alias=AliasChoices("lambda", "lambda_"),
        description="GAE lambda: bias/variance trade-off of advantages.",
    )
    clip_param: float | Schedule = Field(0.2, description="PPO clip range of the probability ratio, or a schedule.")
    vf_clip_param: float | None = Field(
        None,
        gt=0,
        description="Clamp of the squared value error, as RLlib's PPO does (10 there); unset: no clamp, as in SB3 "
        "and cleanrl (a clamp in reward units gives large returns no value gradient).",
    )
    proximal_clip: bool = Field(
        False,
        description="Clip the probability ratio around the module as it was when the update began and weight each "
        "step by that module's probability over the behaviour policy's (decoupled PPO, RLlib's APPO loss), instead "
        "of around the behaviour policy that chose the action (RLlib's PPO). Sampling overlaps training, so the "
        "behaviour policy lags some versions, and clipping around it cuts off much of a batch before the first step.",
    )
    overlap_sampling: bool = Field(
        True,
        description="Servers sample the next train batch while an update runs, so each batch was sampled by the "
        "version before the one it trains (one version of lag; the wall time of sampling hides behind training's). "
        "False: the learner acknowledges nothing during an update, so servers pause and each batch is sampled by "
        "the version it trains (on-policy, as SB3's and RLlib's PPO), at the cost of sampling and training taking "
        "turns.",
    )
    vf_loss_coeff: float = Field(0.5, ge=0, description="Weight of the value loss.")
    entropy_coeff: float | Schedule = Field(0.0, description="Weight of the entropy bonus, or a schedule.")
    grad_clip: float = Field(0.5, gt=0, description="Max global gradient norm.")

    def max_unacked_steps(self, servers: int) -> int:
        """Env steps each of `servers` servers may hold unacknowledged before it pauses sampling (the learner's
        pacing): half a train batch shared among them, so that what waits on them while an update runs is fresh."""
        return max(1, self.train_batch_size // (2 * max(servers, 1)))

    def at(self, env_steps: int) -> PPOConfig:
        """The hyper-parameters of the update after `env_steps` env steps trained: each schedule's value then."""
        return self.model_copy(update={name: scheduled(getattr(self, name), env_steps) for name in SCHEDULED})

    @field_validator(*SCHEDULED, mode="before")
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        """A flag gives `--spec.algorithm.lr 3e-4` as [3e-4] (the field may be a list): one number is a number."""
        if isinstance(value, list) and len(value) == 1 and not isinstance(value[0], list | tuple):
            return value[0]
        return value

    @field_validator(*SCHEDULED)
    @classmethod
    def _valid(cls, value: float | list[tuple[int, float]], info: ValidationInfo) -> float | list[tuple[int, float]]:
        """A number: positive (the entropy bonus may be 0). A schedule: values not negative, env steps increasing."""
        if isinstance(value, int | float):
            if info.field_name == "entropy_coeff" and value < 0:
                raise ValueError("must not be negative")
            if info.field_name != "entropy_coeff" and value <= 0:
                raise ValueError("must be greater than 0")
            return value
        if any(v < 0 for _, v in value):
            raise ValueError("a schedule's values must not be negative")
        if [t for t, _ in value] != sorted({t for t, _ in value}):
            raise ValueError("a schedule's env steps must increase")
        return value
