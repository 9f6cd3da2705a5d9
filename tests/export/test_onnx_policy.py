"""`rlgate.Policy.load` of an exported file: an OnnxPolicy that plays the env as the checkpoint's Policy plays it,
with onnxruntime and numpy alone (torch cannot even be imported), and says what is wrong with a file it cannot
use."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from export.test_parity import LSTM, save_checkpoint
from support.play import play

from rlgate import OnnxPolicy, Policy
from rlgate.core.errors import UserError
from rlgate.export.checkpoint import export_checkpoint

CARTPOLE = gym.make("CartPole-v1")


@pytest.fixture
def files(tmp_path):
    """A checkpoint of a CartPole LSTM policy with previous actions and rewards, and its exported file."""
    path = save_checkpoint(tmp_path, LSTM, CARTPOLE.observation_space, CARTPOLE.action_space)
    file = tmp_path / "cartpole.onnx"
    file.write_bytes(export_checkpoint(path))
    return path, file


def test_policy_load_of_an_exported_file_plays_as_the_checkpoints_policy(files):
    path, file = files
    loaded = Policy.load(file)
    assert isinstance(loaded, OnnxPolicy) and loaded.version == 7
    assert (loaded.observation_space, loaded.action_space) == (CARTPOLE.observation_space, CARTPOLE.action_space)
    reference = Policy.load(path)
    for seed in range(3):
        assert play(loaded, seed) == play(reference, seed)


def test_an_exported_file_acts_where_torch_cannot_be_imported(files):
    path, file = files
    expected = play(Policy.load(path), seed=4)
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["torch"] = None  # `import torch` raises ImportError
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        import rlgate
        from support.play import play
        actions = play(rlgate.OnnxPolicy.load({str(file)!r}), seed=4)
        print(json.dumps({{"actions": actions, "torch": sys.modules["torch"] is not None}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f'{{"actions": {expected}, "torch": false}}'.replace("'", '"')


def test_a_file_that_is_no_export_is_refused_by_name(tmp_path, files):
    with pytest.raises(UserError, match=r"no exported policy at .*missing\.onnx: no such file"):
        OnnxPolicy.load(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(UserError, match=r"junk\.onnx is not an ONNX file onnxruntime can load"):
        OnnxPolicy.load(junk)
    _, file = files
    greedy = OnnxPolicy.load(file)
    with pytest.raises(ValueError, match="export it with --explore to sample"):
        greedy.compute_action(np.zeros(4, np.float32), explore=True)
