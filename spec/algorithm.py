"""The algorithm and its hyper-parameters (`[algorithm] name = "PPO" | "DQN" | "SAC"`), each field declared once.

Fields PPO, DQN and SAC share are declared in the base classes they share; RLlib's names and meanings throughout.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

#: A value that changes over training: [[env_steps, value], ...], linear in between and constant after the last
#: point (RLlib's schedule format), e.g. [[0, 1e-3], [100000, 0.0]] for SB3's "lin_1e-3" over 100k steps.
Schedule = Annotated[list[tuple[Annotated[int, Field(ge=0)], float]], Field(min_length=1)]

#: Every field of any algorithm that takes a schedule; those that may be 0 (the others must be positive).
_SCHEDULE_FIELDS = ("lr", "clip_param", "entropy_coeff", "epsilon", "actor_lr", "critic_lr", "alpha_lr")
_MAY_BE_ZERO = ("entropy_coeff", "epsilon", "alpha_lr")  # alpha_lr 0: SAC's alpha held at initial_alpha


def scheduled(value: float | list[tuple[int, float]], env_steps: int) -> float:
    """The value of a constant, or of a schedule after `env_steps` env steps trained."""
    if isinstance(value, int | float):
        return float(value)
    import numpy as np  # here: `rlgate up` reads specs before it starts its processes, and needs no numpy

    steps, values = zip(*value, strict=True)
    return float(np.interp(env_steps, steps, values))


def _gamma(default: float) -> Any:
    return Field(default, gt=0, le=1, description="Discount factor.")


def _replayed_batch(default: int) -> Any:
    return Field(default, ge=1, description="Transitions sampled from the replay buffer per update.")


def _training_intensity(default: float) -> Any:
    return Field(
        default,
        gt=0,
        description="Replayed transitions per env step sampled (RLlib's): once learning starts, every "
        "train_batch_size / training_intensity env steps the servers sample earn one update (SB3's "
        "gradient_steps * batch_size / train_freq).",
    )


def _target_network_update_freq(default: int) -> Any:
    return Field(default, ge=0, description="Env steps sampled between target network updates (0: after each update).")


def _tau(default: float) -> Any:
    return Field(default, gt=0, le=1, description="Target networks move this far to the trained ones (1: copied).")


def _grad_clip(default: float | None) -> Any:
    return Field(default, gt=0, description="Max global gradient norm (per optimizer); unset: none.")


class _Algorithm(BaseModel):
    """What every algorithm has: a name, schedules, and the pacing the servers are told."""

    model_config = ConfigDict(extra="forbid")

    #: The fields of this algorithm that take a schedule.
    SCHEDULED: ClassVar[tuple[str, ...]] = ()
    #: Whether it learns from a replay buffer (DQN, SAC) rather than from each newest batch (PPO).
    OFF_POLICY: ClassVar[bool] = False

    def at(self, env_steps: int) -> Any:
        """The hyper-parameters after `env_steps` env steps (trained, or for DQN and SAC sampled): each schedule's
        value then."""
        return self.model_copy(update={name: scheduled(getattr(self, name), env_steps) for name in self.SCHEDULED})

    @field_validator(*_SCHEDULE_FIELDS, mode="before", check_fields=False)
    @classmethod
    def _one_number(cls, value: Any) -> Any:
        """A flag gives `--spec.algorithm.lr 3e-4` as [3e-4] (the field may be a list): one number is a number."""
        if isinstance(value, list) and len(value) == 1 and not isinstance(value[0], list | tuple):
            return value[0]
        return value

    @field_validator(*_SCHEDULE_FIELDS, check_fields=False)
    @classmethod
    def _valid(cls, value: float | list[tuple[int, float]], info: ValidationInfo) -> float | list[tuple[int, float]]:
        """A number: positive (an entropy bonus, epsilon or alpha's learning rate may be 0). A schedule: values not
        negative, env steps increasing."""
        if isinstance(value, int | float):
            if info.field_name in _MAY_BE_ZERO and value < 0:
                raise ValueError("must not be negative")
            if info.field_name not in _MAY_BE_ZERO and value <= 0:
                raise ValueError("must be greater than 0")
            return value
        if any(v < 0 for _, v in value):
            raise ValueError("a schedule's values must not be negative")
        if [t for t, _ in value] != sorted({t for t, _ in value}):
            raise ValueError("a schedule's env steps must increase")
        return value


class PPOConfig(_Algorithm):
    """PPO's hyper-parameters, each declared (with its default) only here; the `[algorithm]` of a run spec.

    The defaults are rl-zoo's CartPole-v1 settings (gamma 0.98, lambda 0.8, 20 epochs, lr 1e-3), which
    learn in tens of thousands of env steps. Every field is a flag (`--spec.algorithm.lr 3e-4`); `lr`,
    `clip_param` and `entropy_coeff` also take a schedule over env steps trained (`lr = [[0, 1e-3], [100000, 0]]`),
    as RLlib's do; `at(env_steps)` gives their values for one update.
    """

    SCHEDULED: ClassVar[tuple[str, ...]] = ("lr", "clip_param", "entropy_coeff")

    name: Literal["PPO"] = "PPO"
    train_batch_size: int = Field(512, ge=1, description="Env steps per PPO update.")
    minibatch_size: int = Field(128, ge=1, description="Env steps per SGD minibatch.")
    num_epochs: int = Field(20, ge=1, description="Passes of SGD over each train batch.")
    lr: float | Schedule = Field(1e-3, description="Adam learning rate, or a schedule of it.")
    gamma: float = _gamma(0.98)
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


class ReplayBufferConfig(BaseModel):
    """The replay buffer of DQN and SAC (RLlib's `replay_buffer_config`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer"] = Field(
        "EpisodeReplayBuffer",
        description="EpisodeReplayBuffer (uniform) or PrioritizedEpisodeReplayBuffer (by TD error, Schaul et al.).",
    )
    capacity: int = Field(1_000_000, ge=1, description="Env steps held; the oldest episodes are evicted beyond it.")
    alpha: float = Field(0.6, ge=0, description="Prioritized: how strongly priorities shape sampling (0: uniform).")
    beta: float = Field(0.4, ge=0, description="Prioritized: importance-sampling correction (1: full).")


class _OffPolicy(_Algorithm):
    """What DQN and SAC share: an episode replay buffer, n-step targets, target networks, and the replay ratio."""

    OFF_POLICY: ClassVar[bool] = True
    #: This algorithm's defaults of the replay buffer's fields (RLlib's), under those a spec gives.
    REPLAY_BUFFER: ClassVar[dict[str, Any]] = {}

    n_step: int | tuple[int, int] = Field(
        1,
        description="N-step targets: n env steps' discounted rewards and the observation n steps later (an int), or "
        "n drawn per transition from the closed range [low, high] (two ints).",
    )
    num_steps_sampled_before_learning_starts: int = Field(
        1000, ge=0, description="Env steps sampled into the buffer before the first update (SB3's learning_starts)."
    )
    broadcast_interval: int = Field(
        8,
        ge=1,
        description="Updates between weights pushed to the servers: each push is a new model version (and a row of "
        "progress.csv, the updates' mean diagnostics).",
    )
    td_error_loss_fn: Literal["huber", "mse"] = Field(
        "huber", description="Loss on the TD error: huber (RLlib's, smooth L1 with delta 1) or mse (squared)."
    )
    replay_buffer_config: ReplayBufferConfig = Field(
        default_factory=dict,
        validate_default=True,  # this algorithm's defaults (`_over_defaults`)
        description="The replay buffer: type, capacity and, prioritized, alpha and beta.",
    )
    store_buffer_in_checkpoints: bool = Field(
        False,
        description="Write the replay buffer into checkpoints, so a resumed learner replays what it had (its "
        "steps, as float32 observations: capacity x (2 x observation size + action size + ~10) x 4 bytes at most).",
    )

    def max_unacked_steps(self, servers: int) -> int:
        """Env steps each server may hold unacknowledged while no ack comes: as many as `broadcast_interval`
        updates replay, shared among the servers, and one at least."""
        return max(1, int(self.steps_per_update() * self.broadcast_interval) // max(servers, 1))

    def steps_per_update(self) -> float:
        """Env steps sampled per update: train_batch_size / training_intensity."""
        return self.train_batch_size / self.training_intensity  # type: ignore[attr-defined]

    @field_validator("replay_buffer_config", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        """The fields a spec gives over this algorithm's defaults (`--spec.algorithm.replay-buffer-config.capacity`
        alone keeps DQN's prioritized type)."""
        return {**cls.REPLAY_BUFFER, **value} if isinstance(value, dict) else value

    @field_validator("n_step", mode="before")
    @classmethod
    def _one_n(cls, value: Any) -> Any:
        """A flag gives `--spec.algorithm.n-step 3` as [3] (the field may be a pair): one number is a number."""
        return value[0] if isinstance(value, list) and len(value) == 1 else value

    @field_validator("n_step")
    @classmethod
    def _n_step(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (value, value) if isinstance(value, int) else value
        if not 1 <= low <= high:
            raise ValueError("must be at least 1 (a range: [low, high] with low <= high)")
        return value


class DQNConfig(_OffPolicy):
    """DQN's hyper-parameters (RLlib's DQNConfig names; double and dueling Q by default, as RLlib's).

    `epsilon` (a number or a schedule over env steps sampled) is the chance of a random action in the module's
    exploration forward; the learner sets it into the module's weights, so the servers act with it.
    """

    SCHEDULED: ClassVar[tuple[str, ...]] = ("lr", "epsilon")

    name: Literal["DQN"] = "DQN"
    train_batch_size: int = _replayed_batch(32)
    training_intensity: float = _training_intensity(8.0)  # SB3's default: a batch of 32 every 4 env steps
    gamma: float = _gamma(0.99)
    lr: float | Schedule = Field(5e-4, description="Adam learning rate, or a schedule over env steps sampled.")
    epsilon: float | Schedule = Field(
        [(0, 1.0), (10000, 0.05)],
        description="Chance of a random action when exploring, or a schedule over env steps sampled.",
    )
    double_q: bool = Field(
        True, description="Double DQN: the trained network picks the next action, the target rates it."
    )
    dueling: bool = Field(True, description="Dueling heads: Q = V + A - mean(A).")
    target_network_update_freq: int = _target_network_update_freq(500)
    tau: float = _tau(1.0)
    grad_clip: float | None = _grad_clip(40.0)
    REPLAY_BUFFER: ClassVar[dict[str, Any]] = {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50_000}


class SACConfig(_OffPolicy):
    """SAC's hyper-parameters (RLlib's SACConfig names): twin Q, target networks moved by tau after every update,
    and the entropy temperature alpha tuned towards `target_entropy`. Box actions (a tanh-squashed Gaussian) or
    Discrete ones (discrete SAC, Christodoulou 2019)."""

    SCHEDULED: ClassVar[tuple[str, ...]] = ("actor_lr", "critic_lr", "alpha_lr")

    name: Literal["SAC"] = "SAC"
    train_batch_size: int = _replayed_batch(256)
    training_intensity: float = _training_intensity(256.0)  # one update per env step sampled
    gamma: float = _gamma(0.99)
    target_network_update_freq: int = _target_network_update_freq(0)
    tau: float = _tau(0.005)
    grad_clip: float | None = _grad_clip(None)
    REPLAY_BUFFER: ClassVar[dict[str, Any]] = {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 1_000_000}
    actor_lr: float | Schedule = Field(3e-4, description="Adam learning rate of the policy, or a schedule.")
    critic_lr: float | Schedule = Field(3e-4, description="Adam learning rate of the Q networks, or a schedule.")
    alpha_lr: float | Schedule = Field(
        3e-4,
        description="Adam learning rate of log(alpha), or a schedule; 0: alpha stays initial_alpha (SB3's fixed "
        "ent_coef).",
    )
    twin_q: bool = Field(True, description="Two Q networks, the smaller estimate taken (clipped double Q).")
    initial_alpha: float = Field(1.0, gt=0, description="The entropy temperature alpha to start from.")
    target_entropy: float | Literal["auto"] = Field(
        "auto",
        description="The policy entropy alpha is tuned towards; auto: -(action dimensions) for Box actions, "
        "0.89 * log(n) for Discrete(n) (cleanrl's discrete SAC).",
    )


#: The `[algorithm]` of a run spec: one of these, by `name` ("PPO" when it is not given).
AlgorithmConfig = Annotated[PPOConfig | DQNConfig | SACConfig, Field(discriminator="name")]
ALGORITHMS: dict[str, type[_Algorithm]] = {"PPO": PPOConfig, "DQN": DQNConfig, "SAC": SACConfig}
