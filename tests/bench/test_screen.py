"""`bench.screen`: a preset trained in one process, with the learner's own update."""

from __future__ import annotations

import pytest

from rlgate.bench.screen import screen


def test_cartpole_learns_in_process_and_the_overrides_reach_the_update(capsys: pytest.CaptureFixture[str]) -> None:
    """CartPole's preset (8 envs x 32 steps, 20 epochs) lifts the mean return well past a random policy's ~22
    within 12k env steps; an override that zeroes the learning rate keeps it at a random policy's level."""
    assert screen("CartPole-v1", seed=0, max_steps=12_000, goal=100.0, overrides=[]) is not None
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("env steps" in line and "entropy" in line for line in lines)
    frozen = screen("CartPole-v1", seed=0, max_steps=6_000, goal=100.0, overrides=["lr=1e-12"])
    assert frozen is None


def test_a_preset_with_env_to_module_pieces_is_refused() -> None:
    with pytest.raises(ValueError, match="env-to-module pieces"):
        screen("Acrobot-v1", seed=0, max_steps=1000, goal=0.0, overrides=[])
