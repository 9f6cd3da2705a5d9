"""rlgate: serve reinforcement-learning policies to remote environments over gRPC, and train them.

The repository keeps one folder per room and the build maps each into this package (pyproject.toml,
`[tool.setuptools.package-dir]`): `core/` is `rlgate.core`, `episodes/` is `rlgate.episodes`, and so on;
this folder (`proto/rlgate`) is the package itself, with the wire contract's stubs in `rlgate.v1`.
Layers, each importing only from those below it (tests/test_layers.py checks):
v1 <- core <- episodes <- connectors, models <- spec, service <- export <- policy <- server, learner, client
<- bench <- cli.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgate.export.runtime import OnnxEpisode, OnnxPolicy
    from rlgate.policy import (
        Evaluation,
        MultiAgentPolicy,
        MultiAgentPolicyEpisode,
        Policy,
        PolicyEpisode,
        evaluate,
        evaluate_multi_agent,
    )
    from rlgate.storage.episode_files import read_episodes

# The public API, imported on first use: `import rlgate` stays light (no torch) for the command line.
_PUBLIC = {
    "Policy": "rlgate.policy",
    "PolicyEpisode": "rlgate.policy",
    "Evaluation": "rlgate.policy",
    "evaluate": "rlgate.policy",
    "MultiAgentPolicy": "rlgate.policy",
    "MultiAgentPolicyEpisode": "rlgate.policy",
    "evaluate_multi_agent": "rlgate.policy",
    "OnnxPolicy": "rlgate.export.runtime",
    "OnnxEpisode": "rlgate.export.runtime",
    "read_episodes": "rlgate.storage.episode_files",
}
__all__ = [
    "Evaluation",
    "MultiAgentPolicy",
    "MultiAgentPolicyEpisode",
    "OnnxEpisode",
    "OnnxPolicy",
    "Policy",
    "PolicyEpisode",
    "evaluate",
    "evaluate_multi_agent",
    "read_episodes",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rlgate' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
