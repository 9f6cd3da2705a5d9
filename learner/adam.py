"""Adam for the learner: torch's fused Adam kernel behind the part of torch.optim's interface rlgate uses.

`torch.optim.Adam` imports `torch._dynamo` the first time it is built or steps (its methods are wrapped to keep
torch.compile out): ~1 s of CPU here (sympy, torch.distributed), paid by every learner start before its first
update, on the cores the server and the env clients are starting on too. This class runs the kernel
`torch.optim.Adam(fused=True)` runs (`torch._fused_adam_`: the same update, one kernel per device and dtype) and
keeps torch.optim's state-dict format, so a checkpoint written by either loads into the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

BETAS = (0.9, 0.999)  # torch's, SB3's and RLlib's defaults
EPS = 1e-5  # SB3's PPO's and RLlib's (torch's default is 1e-8, which SB3's DQN and SAC keep)


class Adam:
    """Adam without weight decay or amsgrad over one group of parameters (`param_groups[0]["lr"]` may change)."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], lr: float, eps: float = EPS) -> None:
        # torch.optim.Adam(fused=True)'s group settings, so that its load_state_dict takes our state dict as it is.
        settings = {"weight_decay": 0.0, "amsgrad": False, "maximize": False, "foreach": None, "capturable": False}
        settings |= {"differentiable": False, "fused": True, "decoupled_weight_decay": False}
        self.param_groups: list[dict[str, Any]] = [
            {"params": list(parameters), "lr": lr, "betas": BETAS, "eps": eps, **settings}
        ]
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for parameter in self.param_groups[0]["params"]:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step for every parameter with a gradient."""
        group = self.param_groups[0]
        by_device: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
        for parameter in group["params"]:
            if parameter.grad is None:
                continue
            state = self.state.get(parameter)
            if state is None:
                state = self.state[parameter] = fresh_state(parameter)
            lists = by_device.setdefault((parameter.device, parameter.dtype), [[], [], [], [], []])
            for tensors, tensor in zip(
                lists, (parameter, parameter.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]), strict=True
            ):
                tensors.append(tensor)
        beta1, beta2 = group["betas"]
        for params, grads, exp_avgs, exp_avg_sqs, steps in by_device.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=float(group["lr"]),
                beta1=beta1,
                beta2=beta2,
                weight_decay=0.0,
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's format: per parameter index its state (live tensors), and the group's settings."""
        params = self.param_groups[0]["params"]
        group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {
            "state": {i: self.state[p] for i, p in enumerate(params) if p in self.state},
            "param_groups": [{**group, "params": list(range(len(params)))}],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take a state dict of this format (ours or torch.optim.Adam's): the saved lr, betas and eps, and copies
        of the moments and step counts on each parameter's device."""
        (saved,) = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        if len(saved["params"]) != len(params):
            raise ValueError(f"the state dict has {len(saved['params'])} parameters, this optimizer {len(params)}")
        group = self.param_groups[0]
        group.update(lr=saved["lr"], betas=tuple(saved["betas"]), eps=saved["eps"])
        self.state = {}
        for index, parameter in zip(saved["params"], params, strict=True):
            state = state_dict["state"].get(index)
            if state is not None:
                self.state[parameter] = {
                    "step": torch.as_tensor(state["step"], dtype=torch.float32).to(parameter.device).clone(),
                    "exp_avg": state["exp_avg"].to(parameter.device, parameter.dtype).clone(),
                    "exp_avg_sq": state["exp_avg_sq"].to(parameter.device, parameter.dtype).clone(),
                }


def fresh_state(parameter: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "step": torch.zeros((), dtype=torch.float32, device=parameter.device),
        "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(parameter, memory_format=torch.preserve_format),
    }
