"""The algorithm's hyper-parameters: PPO (the only algorithm so far), each declared and documented once."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PPOConfig(BaseModel):
    """PPO's hyper-parameters, each declared (with its default) only here; the `[algorithm]` of a run spec.

    The defaults are rl-zoo's CartPole-v1 settings (gamma 0.98, lambda 0.8, 20 epochs, lr 1e-3), which
    learn in tens of thousands of env steps. `rlgate learn` takes every field as a flag (`--lr 3e-4`).
    """

    model_config = ConfigDict(extra="forbid")

    train_batch_size: int = Field(512, ge=1, description="Env steps per PPO update.")
    minibatch_size: int = Field(128, ge=1, description="Env steps per SGD minibatch.")
    num_epochs: int = Field(20, ge=1, description="Passes of SGD over each train batch.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    gamma: float = Field(0.98, gt=0, le=1, description="Discount factor.")
    lambda_: float = Field(0.8, ge=0, le=1, description="GAE lambda: bias/variance trade-off of advantages.")
    clip_param: float = Field(0.2, gt=0, description="PPO clip range of the probability ratio.")
    vf_clip_param: float = Field(10.0, gt=0, description="Clip range of the value loss (in reward units).")
    vf_loss_coeff: float = Field(0.5, ge=0, description="Weight of the value loss.")
    entropy_coeff: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    grad_clip: float = Field(0.5, gt=0, description="Max global gradient norm.")
