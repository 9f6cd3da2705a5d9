"""Checkpoints: a round trip restores everything exactly; broken or foreign files fail to load, never run."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.models import ModelConfig, RLModule, build_module, load_weights, weights_to_bytes
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space  # Box with infinite bounds: they must survive JSON
ACTION_SPACE = gym.spaces.Discrete(2)
MODEL_CONFIG = ModelConfig(fcnet_hiddens=(32, 16))
SPEC = RunSpec.parse(
    {"model": {"config": {"fcnet_hiddens": [32, 16]}}, "seed": 3, "env": {"id": "CartPole-v1"}}, "test"
)


def sgd_steps(module: RLModule, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """A few deterministic Adam steps on a made-up loss (same data for every call)."""
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        outputs = module.forward_train({Columns.OBS: torch.randn(8, 4, generator=data)})
        loss = outputs[Columns.ACTION_DIST_INPUTS].pow(2).mean() + outputs[Columns.VF_PREDS].pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def trained() -> tuple[RLModule, torch.optim.Adam]:
    torch.manual_seed(0)
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE, MODEL_CONFIG)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, eps=1e-5)
    sgd_steps(module, optimizer, 3)
    return module, optimizer


def save(directory: Path, version: int, module: RLModule, optimizer: torch.optim.Optimizer | None = None) -> Path:
    return checkpoint.save(
        directory,
        version=version,
        observation_space=OBSERVATION_SPACE,
        action_space=ACTION_SPACE,
        spec=SPEC,
        weights=weights_to_bytes(module),
        optimizer=optimizer,
        connector_state={"mean_std": {"mean": np.arange(4.0), "count": np.array(7)}},
        trained_chunks=["episode-a:0", "episode-a:1", "episode-b:0"],
        env_steps=123,
    )


def test_a_checkpoint_round_trip_restores_weights_spaces_config_and_trained_chunks(tmp_path):
    module, optimizer = trained()
    path = save(tmp_path, 7, module, optimizer)
    assert path == tmp_path / "v000007"
    loaded = checkpoint.load(tmp_path)
    assert loaded.version == 7
    assert loaded.weights == weights_to_bytes(module)  # byte for byte
    assert loaded.observation_space == OBSERVATION_SPACE and loaded.action_space == ACTION_SPACE
    assert loaded.spec == SPEC
    assert loaded.trained_chunks == ["episode-a:0", "episode-a:1", "episode-b:0"]
    assert loaded.env_steps == 123
    np.testing.assert_array_equal(loaded.connector_state["mean_std"]["mean"], np.arange(4.0))
    assert int(loaded.connector_state["mean_std"]["count"]) == 7


def test_the_optimizer_state_restores_so_that_adam_continues_identically(tmp_path):
    module, optimizer = trained()
    save(tmp_path, 1, module, optimizer)
    loaded = checkpoint.load(tmp_path)
    restored = build_module(OBSERVATION_SPACE, ACTION_SPACE, MODEL_CONFIG)
    load_weights(restored, loaded.weights)
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=0.5)  # the checkpoint's lr must win
    restored_optimizer.load_state_dict(loaded.optimizer_state)
    assert restored_optimizer.param_groups[0]["lr"] == 1e-3 and restored_optimizer.param_groups[0]["eps"] == 1e-5

    sgd_steps(module, optimizer, 2)
    sgd_steps(restored, restored_optimizer, 2)
    for (name, original), copy in zip(module.state_dict().items(), restored.state_dict().values(), strict=True):
        assert torch.equal(original, copy), name
    # Without the moments Adam would take different steps: the test above can tell.
    fresh = build_module(OBSERVATION_SPACE, ACTION_SPACE, MODEL_CONFIG)
    load_weights(fresh, loaded.weights)
    sgd_steps(fresh, torch.optim.Adam(fresh.parameters(), lr=1e-3, eps=1e-5), 2)
    assert not all(torch.equal(a, b) for a, b in zip(module.parameters(), fresh.parameters(), strict=True))


def test_latest_points_at_the_newest_checkpoint_and_old_ones_stay_loadable(tmp_path):
    module, _ = trained()
    assert checkpoint.latest(tmp_path) is None
    save(tmp_path, 1, module)
    save(tmp_path, 2, module)
    assert checkpoint.latest(tmp_path) == tmp_path / "v000002"
    assert checkpoint.load(tmp_path).version == 2
    assert checkpoint.load(tmp_path / "v000001").version == 1
    assert checkpoint.load(tmp_path).optimizer_state is None  # saved without one
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / ".latest").exists()


def test_a_directory_without_a_checkpoint_fails_with_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        checkpoint.load(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*: no such directory"):
        checkpoint.load(tmp_path / "nothing-here")


def test_a_latest_pointer_to_a_missing_checkpoint_says_so(tmp_path):
    """Not "no checkpoint": a learner resuming would start afresh and lose the run."""
    save(tmp_path, 1, trained()[0])
    (tmp_path / "latest").write_text("v000999")
    with pytest.raises(checkpoint.CheckpointNotFound, match=r"latest names v000999, but .* holds no checkpoint"):
        checkpoint.latest(tmp_path)


class Payload:
    """Unpickling this creates a file: a checkpoint loader that unpickles anything would run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_a_pickle_in_place_of_the_optimizer_state_fails_to_load_and_runs_nothing(tmp_path):
    module, optimizer = trained()
    path = save(tmp_path, 1, module, optimizer)
    marker = tmp_path / "pwned"
    (path / "optimizer.safetensors").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(checkpoint.CorruptCheckpoint, match=re.escape("optimizer.safetensors is corrupt")):
        checkpoint.load(tmp_path)
    assert not marker.exists()


def test_foreign_weights_fail_with_a_value_error_and_run_nothing(tmp_path):
    module, _ = trained()
    path = save(tmp_path, 1, module)
    marker = tmp_path / "pwned"
    target = build_module(OBSERVATION_SPACE, ACTION_SPACE, MODEL_CONFIG)
    for foreign in (pickle.dumps(Payload(marker)), weights_to_bytes(module)[:-10], b"\0" * 64):
        (path / "weights.safetensors").write_bytes(foreign)
        with pytest.raises(checkpoint.CorruptCheckpoint, match=re.escape("weights.safetensors is corrupt")):
            checkpoint.load(tmp_path)
        with pytest.raises(ValueError, match="not valid safetensors"):
            load_weights(target, foreign)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "junk"),
    [
        ("metadata.json", b'{"version": 1, "env'),
        ("metadata.json", b"\xff not utf-8"),
        ("metadata.json", b"{}"),
        ("connector_state.pb", b"\xff junk"),
        ("optimizer.safetensors", b"garbage"),
        ("weights.safetensors", b"garbage"),
    ],
)
def test_a_corrupt_file_fails_to_load_naming_it(tmp_path, name, junk):
    """One message naming the file (the command line prints it as its one line), for any checkpoint file."""
    module, optimizer = trained()
    path = save(tmp_path, 1, module, optimizer)
    (path / name).write_bytes(junk)
    with pytest.raises(checkpoint.CorruptCheckpoint, match=re.escape(f"checkpoint file {path / name} is corrupt: ")):
        checkpoint.load(tmp_path)


def test_a_checkpoint_describes_itself_in_plain_json(tmp_path):
    """What was trained, with what, by which rlgate: readable without rlgate (and spec.json is a --config)."""
    module, _ = trained()
    path = save(tmp_path, 4, module)
    metadata = json.loads((path / "metadata.json").read_text())
    assert metadata["env_id"] == "CartPole-v1" and metadata["seed"] == 3 and metadata["version"] == 4
    assert metadata["rlgate_version"] and metadata["observation_space"]["box"]
    assert RunSpec.load(path / "spec.json") == SPEC
