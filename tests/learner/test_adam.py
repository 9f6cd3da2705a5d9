"""learner.adam.Adam is torch.optim.Adam(fused=True) step for step, shares its state-dict format both ways, and
builds and steps without importing torch._dynamo (the ~1 s of start-up it exists to save)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.learner.adam import EPS, Adam
from rlgate.models import build_module
from rlgate.storage.checkpoint import optimizer_from_tensors, optimizer_to_tensors

OBSERVATION_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


def module() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_module(OBSERVATION_SPACE, ACTION_SPACE)


def sgd_steps(model: torch.nn.Module, optimizer: object, steps: int, seed: int) -> None:
    """`steps` steps on a loss over every parameter (the value and policy heads both), lr changed midway."""
    generator = torch.Generator().manual_seed(seed)
    for i in range(steps):
        obs = torch.randn(32, 4, generator=generator)
        loss = sum((p * torch.randn(p.shape, generator=generator)).sum() for p in model.parameters())
        loss = loss + model.forward_train({Columns.OBS: obs})[Columns.VF_PREDS].square().mean()
        optimizer.zero_grad()
        loss.backward()
        if i == steps // 2:
            optimizer.param_groups[0]["lr"] = 3e-4  # a schedule's change, as the Trainer makes it
        optimizer.step()


def test_steps_are_torchs_fused_adam_bit_for_bit():
    ours, theirs = module(), module()
    sgd_steps(ours, Adam(ours.parameters(), lr=1e-3), 12, seed=1)
    sgd_steps(theirs, torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=EPS, fused=True), 12, seed=1)
    for (name, mine), other in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(mine, other), name


def test_state_dicts_load_either_way_and_through_a_checkpoint():
    """A checkpoint written by an earlier rlgate (torch.optim.Adam) resumes here, and ours loads into torch's."""
    trained, twin = module(), module()
    torchs = torch.optim.Adam(trained.parameters(), lr=1e-3, eps=EPS)  # the earlier learner's optimizer
    sgd_steps(trained, torchs, 5, seed=2)
    twin.load_state_dict(trained.state_dict())
    tensors, meta = optimizer_to_tensors(torchs)
    ours = Adam(twin.parameters(), lr=1e-3)
    ours.load_state_dict(optimizer_from_tensors(tensors, meta))  # as a resumed learner does
    sgd_steps(trained, torchs, 4, seed=3)
    sgd_steps(twin, ours, 4, seed=3)
    for mine, other in zip(twin.parameters(), trained.parameters(), strict=True):
        torch.testing.assert_close(mine, other, rtol=1e-5, atol=1e-7)  # fused vs single-tensor: rounding only

    back = torch.optim.Adam(module().parameters(), lr=1e-3, eps=EPS, fused=True)
    back.load_state_dict(ours.state_dict())
    assert back.state_dict()["state"][0]["step"].item() == 9.0


def test_no_torch_dynamo_import():
    code = (
        "import sys, torch\n"
        "from rlgate.learner.adam import Adam\n"
        "p = torch.nn.Parameter(torch.ones(3)); opt = Adam([p], lr=0.1)\n"
        "p.sum().backward(); opt.step(); opt.zero_grad()\n"
        "print('torch._dynamo' in sys.modules, float(p[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    imported, value = out.stdout.split()
    assert imported == "False" and float(value) < 1.0  # stepped, and against the gradient
