"""PolicyGraph: a policy's folded env-to-module pieces, its module and its action selection as one torch module
whose trace is the exported ONNX graph (the tensor contract: `contract`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.export import contract
from rlgate.export.actions import ActionSelection
from rlgate.export.contract import BATCH, TensorSpec, at, leaf_paths, nest, state_names
from rlgate.export.folded import Folded
from rlgate.export.pieces import NotExportable
from rlgate.models import RLModule


class PolicyGraph(nn.Module):
    """obs leaves [, reward] [, state_in.*] [, noise] -> actions [, action_logp] [, action_dist_inputs] [, state_out.*]
    [, module_actions] (action_dist_inputs where the module returns them: DQN's module returns its greedy actions
    instead; module_actions, the module's own sampled actions that an episode records, where the graph samples and
    makes them fit for the env, a Box's).

    `observation_space`: what the graph's observation inputs hold (the env's, or with `module_only` the module's);
    `folded`: the env-to-module pieces from those observations to the module's (none with `module_only`). With
    `module_only`, `actions` are the module's own (ACTIONS); otherwise they are made fit for the env
    (ACTIONS_FOR_ENV). `inputs` and `outputs` describe the tensors in order; `initial_state` gives each state
    input's value per row at an episode's start.
    """

    def __init__(
        self,
        module: RLModule,
        folded: list[Folded],
        selection: ActionSelection,
        observation_space: gym.Space,
        *,
        module_only: bool,
    ) -> None:
        super().__init__()
        self.module = module
        self.folded = nn.ModuleList(folded)
        self.selection = selection
        self.module_only = module_only
        self.obs_leaves = leaf_paths(observation_space)
        self.obs_spaces = [_leaf_space(observation_space, path) for _, path in self.obs_leaves]
        self.stateful = module.is_stateful()
        initial = module.get_initial_state()
        module_state = {k: v.detach().cpu().numpy() for k, v in _flat_state(initial).items()}
        self.module_state_paths = dict(state_names(initial))
        self.piece_state = [list(piece.initial_state) for piece in folded]
        self.initial_state: dict[str, np.ndarray] = {}
        for part in [*(piece.initial_state for piece in folded), module_state]:
            for name, value in part.items():
                if name in self.initial_state:
                    raise NotExportable(f"two parts of the policy carry a state named {name!r}")
                self.initial_state[name] = value
        self.uses_reward = any(piece.uses_reward for piece in folded)
        self.inputs = self._inputs()
        self.outputs: list[TensorSpec] = []  # set by the first forward outside a trace

    def _inputs(self) -> list[TensorSpec]:
        specs = [
            TensorSpec(name, _dtype_name(space), (BATCH, *_leaf_shape(space)), f"observation leaf {space}")
            for (name, _), space in zip(self.obs_leaves, self.obs_spaces, strict=True)
        ]
        if self.uses_reward:
            doc = "the reward for the previous action (0 at a reset)"
            specs.append(TensorSpec(contract.REWARD, "float32", (BATCH,), doc))
        for name, value in self.initial_state.items():
            doc = "state from the previous step's state_out (the initial state at an episode's start)"
            specs.append(TensorSpec(contract.STATE_IN + name, value.dtype.name, (BATCH, *value.shape), doc))
        if self.selection.explore:
            kind, greedy = self.selection.noise_kind, self.selection.greedy_noise
            draws = "Exponential(1)" if kind == "exponential" else "N(0, 1)"
            doc = f"{draws} draws the action is sampled from; all {greedy} gives the greedy action"
            specs.append(TensorSpec(contract.NOISE, "float32", (BATCH, self.selection.noise_width), doc))
        return specs

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        named = dict(zip([spec.name for spec in self.inputs], inputs, strict=True))
        obs = nest([named[name] for name, _ in self.obs_leaves], [path for _, path in self.obs_leaves])
        reward = named.get(contract.REWARD)
        states = []
        for piece, names in zip(self.folded, self.piece_state, strict=True):
            obs, state = piece(obs, {n: named[contract.STATE_IN + n] for n in names}, reward)
            states.append(state)
        obs = map_structure(lambda x: x.float() if x.dtype == torch.float64 else x, obs)  # as NumpyToTensor
        batch: dict[str, Any] = {Columns.OBS: obs}
        if self.stateful:
            batch[Columns.OBS] = map_structure(lambda x: x.unsqueeze(1), obs)  # a time axis of 1
            batch[Columns.STATE_IN] = nest(
                [named[contract.STATE_IN + n] for n in self.module_state_paths], list(self.module_state_paths.values())
            )
        out = self.module.forward_exploration(batch) if self.selection.explore else self.module.forward_inference(batch)
        dist_inputs, logp = out.get(Columns.ACTION_DIST_INPUTS), None
        if dist_inputs is None:  # a module that chooses its actions itself (DQN's argmax of Q), as GetActions keeps
            actions = self._own_actions(out)
        else:
            if self.stateful:
                dist_inputs = dist_inputs.squeeze(1)
            actions, logp = self.selection(dist_inputs, named.get(contract.NOISE))
        results = {contract.ACTIONS: actions if self.module_only else self.selection.for_env(actions)}
        if logp is not None:
            results[contract.ACTION_LOGP] = logp
        if dist_inputs is not None:
            results[contract.ACTION_DIST_INPUTS] = dist_inputs
        for piece, state in zip(self.folded, states, strict=True):
            results.update({contract.STATE_OUT + n: v for n, v in piece.after_actions(state, actions).items()})  # type: ignore[operator]  # a Folded: nn.ModuleList yields Modules
        if self.stateful:
            module_out = _flat_state(out[Columns.STATE_OUT])
            results.update({contract.STATE_OUT + n: module_out[n] for n in self.module_state_paths})
        if self.selection.explore and not self.module_only and self.selection.adapts:
            results[contract.MODULE_ACTIONS] = actions  # last: the outputs before it keep their places
        if not torch.jit.is_tracing():  # (a trace's shapes are tensors)
            self.outputs = [_output_spec(name, value) for name, value in results.items()]
        return tuple(results.values())

    def _own_actions(self, out: dict[str, Any]) -> torch.Tensor:
        """The actions a module returned in place of distribution inputs: greedy ones only (its own exploration,
        DQN's epsilon-greedy, draws from torch's generator, which no graph input can stand for)."""
        if Columns.ACTIONS not in out:
            raise NotExportable("the module returns neither action_dist_inputs nor actions: not exportable")
        if self.selection.explore:
            raise NotExportable(
                "the module chooses its exploring actions itself (DQN's epsilon-greedy draws them from torch's "
                "generator, not from a noise input): export it without --explore, serve it with --backend torch"
            )
        actions = out[Columns.ACTIONS]
        return actions.squeeze(1) if self.stateful else actions

    def example_inputs(self, rows: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs for a trace: sampled observations, zero rewards, the initial state, greedy noise."""
        feeds = [np.stack([np.asarray(s.sample(), np.dtype(s.dtype)) for _ in range(rows)]) for s in self.obs_spaces]
        for spec in self.inputs[len(feeds) :]:
            if spec.name.startswith(contract.STATE_IN):
                value = self.initial_state[spec.name.removeprefix(contract.STATE_IN)]
                feeds.append(np.repeat(value[None], rows, axis=0))
            else:  # reward, noise
                fill = self.selection.greedy_noise if spec.name == contract.NOISE else 0.0
                feeds.append(np.full((rows, *spec.shape[1:]), fill, np.float32))
        return tuple(torch.from_numpy(np.ascontiguousarray(feed)) for feed in feeds)


def _leaf_space(space: gym.Space, path: tuple) -> gym.Space:
    for key in path:
        assert isinstance(space, gym.spaces.Dict | gym.spaces.Tuple)  # a path leads through Dicts and Tuples
        space = space[key]
    return space


def _leaf_shape(space: gym.Space) -> tuple[int, ...]:
    assert space.shape is not None  # a leaf space
    return tuple(int(n) for n in space.shape)


def _dtype_name(space: gym.Space) -> str:
    return np.dtype(space.dtype).name


def _flat_state(state: dict[str, Any]) -> dict[str, Any]:
    """A (nested) state dict as {dotted name: leaf}."""
    return {name: at(state, path) for name, path in state_names(state)}


def _output_spec(name: str, value: torch.Tensor) -> TensorSpec:
    docs = {
        contract.ACTIONS: "the action",
        contract.ACTION_LOGP: "log-probability of the sampled action",
        contract.ACTION_DIST_INPUTS: "the module's action distribution inputs",
        contract.MODULE_ACTIONS: "the module's own sampled action, before it is made fit for the env",
    }
    doc = docs.get(name, "state for the next step's state_in")
    dtype = str(value.dtype).removeprefix("torch.")
    return TensorSpec(name, dtype, (BATCH, *value.shape[1:]), doc)
