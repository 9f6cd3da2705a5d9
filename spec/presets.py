"""Presets: run specs tuned for the classic-control, Box2D, Atari and MiniGrid envs (rl-zoo's PPO settings, each
file says which), shipped in `spec/presets/<env id>.toml`, or `<namespace>.toml` for every id of a namespace
(`ALE.toml` for ALE/Pong-v5, ALE/Breakout-v5, ...); a spec given for such an env starts from its preset."""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

from rlgate.spec.imports import SpecError


def preset_names() -> list[str]:
    """The env ids that have a preset."""
    folder = resources.files("rlgate.spec") / "presets"
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def preset_for(env_id: str) -> str | None:
    """The preset of an env id: its own, else its namespace's (`ALE/Pong-v5` -> `ALE`), else None."""
    names = preset_names()
    namespace = env_id.split("/")[0] if "/" in env_id else None
    return env_id if env_id in names else namespace if namespace in names else None


def preset(name: str) -> dict[str, Any]:
    """The preset's spec data; SpecError names the presets there are."""
    if name not in preset_names():
        raise SpecError(f"no preset {name!r}; presets: {', '.join(preset_names())} (or 'none')")
    return tomllib.loads((resources.files("rlgate.spec") / "presets" / f"{name}.toml").read_text())
