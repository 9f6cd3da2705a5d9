"""MultiRLModule: several RLModules under module ids, run as one (RLlib's MultiRLModule).

A multi-agent batch is `{module_id: module_batch}`; each forward method runs every module that has a
sub-batch, once, and returns `{module_id: module_outputs}`. Agents share weights by mapping to the same
module (one shared module), or not (one module per agent). It is a read-only Mapping of module id ->
RLModule (`multi_module["default_policy"]`, `"p0" in multi_module`), which is how connector pieces tell it
from a single RLModule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from rlgate.models.rl_module import RLModule


class MultiRLModule(nn.Module):
    """Module id -> RLModule; forward methods split a `{module_id: batch}` batch per module."""

    def __init__(self, modules: Mapping[str, RLModule]) -> None:
        super().__init__()
        if not modules:
            raise ValueError("a MultiRLModule needs at least one module")
        self._rl_modules = dict(modules)
        # Registered by position: a module id is any string (under per_agent mapping, the env's agent id, e.g. one
        # from a client's hello), and torch refuses a submodule name with a "." or one of its attributes' ("keys").
        self._registered = nn.ModuleList(self._rl_modules.values())

    def __getitem__(self, module_id: str) -> RLModule:
        if module_id not in self._rl_modules:
            raise KeyError(f"no module {module_id!r} (modules: {', '.join(self._rl_modules)})")
        return self._rl_modules[module_id]

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._rl_modules

    def __iter__(self) -> Iterator[str]:
        return iter(self._rl_modules)

    def __len__(self) -> int:
        return len(self._rl_modules)

    def keys(self) -> list[str]:
        return list(self._rl_modules)

    def items(self) -> list[tuple[str, RLModule]]:
        return list(self._rl_modules.items())

    def values(self) -> list[RLModule]:
        return list(self._rl_modules.values())

    def foreach_module(self, func: Callable[[str, RLModule], Any], return_dict: bool = False) -> Any:
        """`func(module_id, module)` for every module: a list of results, or a dict by module id."""
        results = {module_id: func(module_id, module) for module_id, module in self._rl_modules.items()}
        return results if return_dict else list(results.values())

    def _run(self, method: str, batch: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(batch) - set(self._rl_modules))
        if unknown:
            raise KeyError(f"batch has data for unknown modules {unknown} (modules: {', '.join(self._rl_modules)})")
        return {module_id: getattr(self._rl_modules[module_id], method)(data) for module_id, data in batch.items()}

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._run("forward_inference", batch)

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._run("forward_exploration", batch)

    def forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._run("forward_train", batch)

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self.forward_train(batch)

    def compute_values(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Each module's value estimates for its sub-batch."""
        return self._run("compute_values", batch)

    def is_stateful(self) -> bool:
        """True when any module is stateful (each piece checks per module)."""
        return any(module.is_stateful() for module in self._rl_modules.values())

    def get_initial_state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {module_id: module.get_initial_state() for module_id, module in self._rl_modules.items()}


Mapping.register(MultiRLModule)
