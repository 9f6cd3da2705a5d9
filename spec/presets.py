"""Presets: run specs tuned for the classic-control, Box2D, Atari and MiniGrid envs (rl-zoo's settings, each file
says which), per algorithm: PPO's in `spec/presets/<env id>.toml`, or `<namespace>.toml` for every id of a namespace
(`ALE.toml` for ALE/Pong-v5, ALE/Breakout-v5, ...); DQN's and SAC's in `spec/presets/<algorithm>/<env id>.toml`. A
spec given for such an env and algorithm starts from its preset."""

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


def preset_for(env_id: str, algorithm: str = ALGORITHM) -> str | None:
    """The algorithm's preset of an env id: its own, else its namespace's (`ALE/Pong-v5` -> `ALE`), else None."""
    names = preset_names(algorithm)
    namespace = env_id.split("/")[0] if "/" in env_id else None
    return env_id if env_id in names else namespace if namespace in names else None


def preset(name: str, algorithm: str = ALGORITHM) -> dict[str, Any]:
    """The preset's spec data; SpecError names the presets there are for the algorithm."""
    if name not in preset_names(algorithm):
        names = ", ".join(preset_names(algorithm))
        raise SpecError(f"no preset {name!r} for {algorithm}; {algorithm}'s presets: {names} (or 'none')")
    return tomllib.loads((_folder(algorithm) / f"{name}.toml").read_text())
