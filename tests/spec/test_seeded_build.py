"""A seeded spec builds the same weights in every process, whatever torch's thread count there (the learner and
a server each build version 0 of it: the server serves its own until the learner's first update)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.models import weights_to_bytes
from rlgate.spec.build import build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import build_multi_rl_module
from rlgate.spec.run import RunSpec

BOX = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
ACT = gym.spaces.Discrete(2)


def built_on(threads: int, build) -> bytes:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return build()
    finally:
        assert torch.get_num_threads() == threads  # the build leaves the process's setting alone
        torch.set_num_threads(before)


@pytest.mark.parametrize("multi_agent", [False, True], ids=["single_agent", "multi_agent"])
def test_a_seeded_spec_builds_the_same_weights_on_any_number_of_threads(multi_agent: bool) -> None:
    spec = RunSpec(seed=3, model={"config": {"fcnet_hiddens": [64, 64]}})  # a 64x64 orthogonal init: QR

    def build() -> bytes:
        if multi_agent:
            module = build_multi_rl_module(spec, {"a": (BOX, ACT), "b": (BOX, ACT)}, ImportPolicy())
            return b"".join(weights_to_bytes(module[m]) for m in ("a", "b"))
        return weights_to_bytes(build_rl_module(spec, BOX, ACT, ImportPolicy()))

    assert built_on(1, build) == built_on(4, build)
