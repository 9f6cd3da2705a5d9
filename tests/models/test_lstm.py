"""The LSTM module: initial state, state carried across calls, and a [B, T] unroll equal to T steps."""

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.models import ModelConfig, build_module

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
CONFIG = ModelConfig(use_lstm=True, lstm_cell_size=8, fcnet_hiddens=(16,))


def test_initial_state_is_unbatched_zeros() -> None:
    module = build_module(OBS, gym.spaces.Discrete(2), CONFIG)
    state = module.get_initial_state()
    assert set(state) == {"h", "c"}
    assert all(t.shape == (8,) and not t.any() for t in state.values())
    assert module.is_stateful()


def test_state_carried_across_calls_changes_outputs(sample_obs: Callable, initial_state: Callable) -> None:
    module = build_module(OBS, gym.spaces.Discrete(2), CONFIG)
    obs = sample_obs(OBS, 3, 1)
    with torch.inference_mode():
        first = module.forward_inference({Columns.OBS: obs, Columns.STATE_IN: initial_state(module, 3)})
        fresh = module.forward_inference({Columns.OBS: obs, Columns.STATE_IN: initial_state(module, 3)})
        carried = module.forward_inference({Columns.OBS: obs, Columns.STATE_IN: first[Columns.STATE_OUT]})
    torch.testing.assert_close(first, fresh)
    assert first[Columns.STATE_OUT]["h"].abs().sum() > 0
    assert not torch.allclose(carried[Columns.ACTION_DIST_INPUTS], first[Columns.ACTION_DIST_INPUTS])
    assert not torch.allclose(carried[Columns.STATE_OUT]["c"], first[Columns.STATE_OUT]["c"])


def test_sequence_equals_step_by_step_unroll(sample_obs: Callable, initial_state: Callable) -> None:
    module = build_module(OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), CONFIG)
    obs = sample_obs(OBS, 2, 6)
    with torch.inference_mode():
        whole = module.forward_train({Columns.OBS: obs, Columns.STATE_IN: initial_state(module, 2)})
        state, steps = initial_state(module, 2), []
        for t in range(6):
            out = module.forward_exploration({Columns.OBS: obs[:, t : t + 1], Columns.STATE_IN: state})
            state = out[Columns.STATE_OUT]
            steps.append(out)
        values = module.compute_values({Columns.OBS: obs, Columns.STATE_IN: initial_state(module, 2)})
    stepped = torch.cat([s[Columns.ACTION_DIST_INPUTS] for s in steps], dim=1)
    torch.testing.assert_close(stepped, whole[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(state, whole[Columns.STATE_OUT])
    torch.testing.assert_close(values, whole[Columns.VF_PREDS])
