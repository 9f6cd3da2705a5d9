"""Presets: run specs tuned for the classic-control and Box2D envs (rl-zoo's PPO settings, each file says
which), shipped in `spec/presets/<env id>.toml`; a spec given for such an env starts from its preset."""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

from rlgate.spec.imports import SpecError


def preset_names() -> list[str]:
    """The env ids that have a preset."""
    folder = resources.files("rlgate.spec") / "presets"
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def preset(name: str) -> dict[str, Any]:
    """The preset's spec data; SpecError names the presets there are."""
    if name not in preset_names():
        raise SpecError(f"no preset {name!r}; presets: {', '.join(preset_names())} (or 'none')")
    return tomllib.loads((resources.files("rlgate.spec") / "presets" / f"{name}.toml").read_text())
