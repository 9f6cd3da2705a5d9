"""Importing the code a run spec names (`module:attribute`), only from modules the operator allowed.

Naming code to import is the decision of whoever runs the process: a spec that arrives over the wire
(a server's, from its learner) or from disk (a checkpoint) may name only modules in the process's
`allow_import` list; a spec its operator passed on the command line (`--config`) allows what it names.
rlgate's own modules are always allowed.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from rlgate.core.errors import UserError

# Packages that a spec's code may need and an rlgate extra installs: the missing package -> the extra.
# (PettingZoo's classic games import pygame, which its extra installs too.)
EXTRAS = {"pettingzoo": "pettingzoo", "pygame": "pettingzoo"}


class SpecError(UserError, ValueError):
    """A run spec that cannot be used here: the message says what and how to fix it."""


def split_path(path: str) -> tuple[str, str]:
    """'pkg.mod:Name' -> ('pkg.mod', 'Name'); raises SpecError for anything else."""
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute or not all(part.isidentifier() for part in module.split(".")):
        raise SpecError(f"{path!r} is not an import path: write it as 'package.module:Name'")
    return module, attribute


class ImportPolicy:
    """Which modules this process may import because a spec names them."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = tuple(sorted({name.strip() for name in allowed if name.strip()}))

    def allows(self, module: str) -> bool:
        """rlgate's own modules, and each allowed module with its submodules."""
        return any(module == name or module.startswith(f"{name}.") for name in ("rlgate", *self.allowed))

    def load(self, path: str, what: str) -> Any:
        """The object at `path` ('pkg.mod:Name'); `what` names it in errors (e.g. "env_to_module[0]")."""
        module_name, attribute = split_path(path)
        module = self.import_module(module_name, what)
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise SpecError(f"{what}: module {module_name!r} has no {attribute!r}") from None

    def import_module(self, name: str, what: str) -> ModuleType:
        """Import module `name` if allowed; SpecError says why not."""
        if not self.allows(name):
            allowed = ", ".join(self.allowed) or "none"
            raise SpecError(
                f"{what}: the run spec names code in {name!r}, which this process may not import "
                f"(allowed: {allowed}); its operator can allow it with --allow-import {name.split('.')[0]}"
            )
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing in EXTRAS:  # an extra not installed: say which
                raise SpecError(
                    f"{what}: {name} needs {missing}: pip install 'rlgate[{EXTRAS[missing]}]' ({exc})"
                ) from None
            raise SpecError(f"{what}: cannot import {name!r}: {exc}") from exc
        except Exception as exc:  # the module itself is broken: a SyntaxError, or an error it raised
            raise SpecError(f"{what}: cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
