"""Weights as safetensors bytes: round trip, and strict rejection of anything that does not fit."""

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.models import ModelConfig, build_module, load_weights, weights_to_bytes

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


def _outputs(module: torch.nn.Module, obs: torch.Tensor) -> dict:
    """Every head's output (the train forward has the value head too)."""
    with torch.inference_mode():
        return module.forward_train({Columns.OBS: obs})


def test_round_trip_into_fresh_module(sample_obs: Callable) -> None:
    config = ModelConfig(free_log_std=True)
    torch.manual_seed(1)
    trained = build_module(OBS, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), config)
    with torch.no_grad():
        trained.log_std.fill_(-0.7)
    torch.manual_seed(2)
    fresh = build_module(OBS, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), config)
    obs = sample_obs(OBS, 5)
    assert not torch.allclose(_outputs(fresh, obs)[Columns.VF_PREDS], _outputs(trained, obs)[Columns.VF_PREDS])
    data = weights_to_bytes(trained)
    assert isinstance(data, bytes) and data[8:9] == b"{"  # safetensors: u64 header length, JSON header
    load_weights(fresh, data)
    torch.testing.assert_close(_outputs(fresh, obs), _outputs(trained, obs), rtol=0, atol=0)


def test_round_trip_lstm(sample_obs: Callable, initial_state: Callable) -> None:
    config = ModelConfig(use_lstm=True, lstm_cell_size=8)
    trained, fresh = build_module(OBS, DISCRETE, config), build_module(OBS, DISCRETE, config)
    load_weights(fresh, weights_to_bytes(trained))
    batch = {Columns.OBS: sample_obs(OBS, 2, 3), Columns.STATE_IN: initial_state(trained, 2)}
    with torch.inference_mode():
        torch.testing.assert_close(fresh.forward_train(batch), trained.forward_train(batch), rtol=0, atol=0)


def _rejects(module: torch.nn.Module, data: bytes, match: str) -> None:
    before = weights_to_bytes(module)
    with pytest.raises(ValueError, match=match):
        load_weights(module, data)
    assert weights_to_bytes(module) == before  # untouched


def test_rejects_shape_mismatch_naming_the_key() -> None:
    data = weights_to_bytes(build_module(OBS, gym.spaces.Discrete(3)))
    _rejects(build_module(OBS, DISCRETE), data, r"'pi\.out\.weight' is torch\.float32\[3, 64\]")


def test_rejects_missing_and_unexpected_keys() -> None:
    shared = build_module(OBS, DISCRETE, ModelConfig(vf_share_layers=True))
    separate = build_module(OBS, DISCRETE)
    _rejects(separate, weights_to_bytes(shared), r"tensors missing \['vf_encoder\.hidden\.0\.bias'")
    _rejects(shared, weights_to_bytes(separate), r"unexpected \['vf_encoder\.hidden\.0\.bias'")


def test_rejects_dtype_mismatch_and_garbage() -> None:
    module = build_module(OBS, DISCRETE)
    _rejects(module, weights_to_bytes(build_module(OBS, DISCRETE).double()), "float64")
    _rejects(module, b"not safetensors at all", "not valid safetensors")
