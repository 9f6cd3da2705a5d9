"""Checkpoints of fresh (seeded) models, written as a learner writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

from rlgate.models import weights_to_bytes
from rlgate.spec.env import agent_spaces
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import build_multi_agent_policy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint


def multi_agent_checkpoint(directory: Path, spec: dict[str, Any], version: int = 4) -> tuple[Path, RunSpec]:
    """A checkpoint of a fresh multi-agent model of `spec` (seed 3) for its env's agents."""
    run = RunSpec.model_validate({**spec, "seed": 3})
    imports = ImportPolicy(run.modules())
    spaces = agent_spaces(run.env, imports)
    built = build_multi_agent_policy(run, spaces, imports)
    path = checkpoint.save(
        directory,
        version=version,
        spec=run,
        observation_space=gym.spaces.Dict({agent: pair[0] for agent, pair in spaces.items()}),
        action_space=gym.spaces.Dict({agent: pair[1] for agent, pair in spaces.items()}),
        weights={module_id: weights_to_bytes(built.module[module_id]) for module_id in built.module},
    )
    return path, run
