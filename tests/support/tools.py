"""Commands some tests need from the system (chromium, promtool, node, npm): `.ci/system-packages` installs them."""

from __future__ import annotations

import os
import shutil

import pytest


def required_command(name: str, package: str) -> str:
    """The path of command `name`. Without it the test is skipped, with the reason, except under CI=true,
    where it fails: CI installs the Debian `package` (`.ci/run`), so the test must run there."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: `.ci/system-packages` installs it (Debian package {package}) as root"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{message}; under CI=true this test must run")
        pytest.skip(message)
    return path
