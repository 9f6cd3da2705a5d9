"""A module written RLlib's way (`setup()`, `_forward_inference` / `_forward_exploration`, no distribution method)
serves and trains as RLlib would run it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.servers import BOX4, DISCRETE2, RawStream, hello, step

from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.models import Categorical, DiagGaussian, MultiCategorical, RLModule
from rlgate.models.catalog import UnsupportedSpace
from rlgate.spec.build import build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import ModelSpec, RunSpec

MODULE = "support.rllib_style_module:RLlibStyleModule"


def test_setup_builds_the_layers_and_the_distribution_defaults_to_the_catalogs() -> None:
    spec = RunSpec(model=ModelSpec(module_class=MODULE, config={"hidden": 8}))
    module = build_rl_module(spec, BOX4, DISCRETE2, ImportPolicy(["support"]))
    assert module.body[0].out_features == 8 and module.vf.in_features == 8  # built in setup(), value head included
    assert module.get_train_action_dist_cls() is Categorical
    assert module.get_inference_action_dist_cls() is Categorical
    assert module.get_exploration_action_dist_cls() is Categorical
    batch = {Columns.OBS: torch.zeros(3, 4)}
    assert module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS].argmax(-1).tolist() == [0, 0, 0]
    assert module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS].argmax(-1).tolist() == [1, 1, 1]
    # The train forward is _forward's (RLlib's default too): neither forcing.
    logits = module.forward_train(batch)[Columns.ACTION_DIST_INPUTS]
    assert torch.equal(logits, module._forward(batch)[Columns.ACTION_DIST_INPUTS])


class _Bare(RLModule):
    def _forward(self, batch: dict) -> dict:
        return batch

    def compute_values(self, batch: dict) -> torch.Tensor:
        return torch.zeros(1)


@pytest.mark.parametrize(
    ("action_space", "expected"),
    [
        (gym.spaces.Discrete(3), Categorical),
        (gym.spaces.Box(-1, 1, (2,), np.float32), DiagGaussian),
        (gym.spaces.MultiDiscrete([2, 3]), MultiCategorical),
    ],
)
def test_default_distribution_per_action_space(action_space: gym.Space, expected: type) -> None:
    module = _Bare(BOX4, action_space, {})
    assert issubclass(module.get_train_action_dist_cls(), expected)
    assert module.get_exploration_action_dist_cls() is module.get_train_action_dist_cls()  # one class, not one a call


def test_action_dist_cls_set_in_setup_is_every_forwards_and_an_unknown_space_says_what_to_do() -> None:
    class Custom(_Bare):
        def setup(self) -> None:
            self.action_dist_cls = DiagGaussian

    module = Custom(BOX4, gym.spaces.Discrete(2), {})
    assert module.get_exploration_action_dist_cls() is DiagGaussian
    assert module.get_inference_action_dist_cls() is DiagGaussian
    with pytest.raises(UnsupportedSpace, match="does not support the action space"):
        _Bare(BOX4, gym.spaces.MultiBinary(3), {}).get_train_action_dist_cls()


@pytest.mark.parametrize(("explore", "action"), [(True, 0), (False, 1)])
async def test_a_server_runs_the_exploration_forward_to_sample_and_the_inference_forward_to_act_greedily(
    server_factory, explore: bool, action: int
) -> None:
    server = await server_factory(spec=RunSpec(model=ModelSpec(module_class=MODULE)))
    raw = RawStream(server)
    try:
        await raw.send(hello(explore=explore, num_envs=2))
        assert (await raw.recv()).HasField("welcome")
        answered = []
        for i in range(5):
            await raw.send(step(np.full((2, 4), 0.1 * i, np.float32), n=2))
            answered += codec.from_value((await raw.recv()).actions.actions).tolist()
        assert answered == [action] * 10
    finally:
        await raw.close()
