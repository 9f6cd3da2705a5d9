"""A user's module whose acting forwards give no actions, or distribution inputs that do not fit its action space,
is refused where it is built (learner, server, policy), in one line naming the module and what is wrong: it would
fail at its first step (blamed on the env clients) or sample actions the env does not have (the env then crashes)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlgate.spec.build import build_rl_module
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import RunSpec

pytestmark = pytest.mark.usefixtures("examples_importable")  # support.wrong_module builds on examples.tiny_module

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTIONS = gym.spaces.Discrete(2)


def spec(module_class: str) -> RunSpec:
    return RunSpec.model_validate({"model": {"module_class": module_class}})


def test_a_module_with_more_logits_than_actions_is_refused_naming_both():
    with pytest.raises(SpecError, match=r"WrongLogits.*shape \(4,\) per step; Categorical over Discrete\(2\) takes"):
        build_rl_module(spec("support.wrong_module:WrongLogits"), BOX, ACTIONS, ImportPolicy(["support"]))


def test_a_module_that_fits_is_built():
    module = build_rl_module(spec("examples.tiny_module:TinyActorCritic"), BOX, ACTIONS, ImportPolicy(["examples"]))
    assert module.action_space == ACTIONS


def test_a_module_whose_greedy_forward_returns_logits_is_refused_naming_the_module_and_the_key():
    with pytest.raises(
        SpecError,
        match=r"^model.module_class: 'support.wrong_module:LogitsNotDistInputs': its forward_inference returned no "
        r"'action_dist_inputs' \(the inputs of its action distribution\) nor 'actions': it returned \['logits'\]$",
    ):
        build_rl_module(spec("support.wrong_module:LogitsNotDistInputs"), BOX, ACTIONS, ImportPolicy(["support"]))


def test_a_stateful_module_that_returns_no_state_is_refused():
    with pytest.raises(
        SpecError, match=r"ForgetsItsState'.*stateful, but its forward_exploration returned no 'state_out'"
    ):
        build_rl_module(spec("support.wrong_module:ForgetsItsState"), BOX, ACTIONS, ImportPolicy(["support"]))
