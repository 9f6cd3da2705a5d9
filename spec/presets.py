"""Presets: run specs tuned for the classic-control and Box2D envs (rl-zoo's settings, each file says which),
per algorithm: PPO's in `spec/presets/<env id>.toml`, DQN's and SAC's in `spec/presets/<algorithm>/<env id>.toml`.
A spec given for such an env and algorithm starts from its preset."""

from __future__ import annotations

import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from rlgate.spec.imports import SpecError

ALGORITHM = "PPO"  # the algorithm of a spec that names none
ALGORITHMS = ("PPO", "DQN", "SAC")  # those with presets: a folder each but PPO's


def _folder(algorithm: str) -> Traversable:
    presets = resources.files("rlgate.spec") / "presets"
    return presets if algorithm == ALGORITHM else presets / algorithm


def preset_names(algorithm: str = ALGORITHM) -> list[str]:
    """The env ids that have a preset for this algorithm."""
    if algorithm not in ALGORITHMS:
        return []
    folder = _folder(algorithm)
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def preset(name: str, algorithm: str = ALGORITHM) -> dict[str, Any]:
    """The preset's spec data; SpecError names the presets there are for the algorithm."""
    if name not in preset_names(algorithm):
        names = ", ".join(preset_names(algorithm))
        raise SpecError(f"no preset {name!r} for {algorithm}; {algorithm}'s presets: {names} (or 'none')")
    return tomllib.loads((_folder(algorithm) / f"{name}.toml").read_text())
