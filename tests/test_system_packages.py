"""`make test` on a machine without chromium, promtool and node: their tests skip, saying why (they fail under
CI=true), and .ci/system-packages installs nothing where it cannot, without failing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import required_command

ROOT = Path(__file__).resolve().parent.parent
NEEDS_COMMANDS = [  # 8 tests, each needing chromium, promtool or node (and npm)
    "tests/learner/test_page.py::test_the_live_page_shows_progress_charts_and_the_connected_server",
    "tests/learner/test_page.py::test_the_page_says_an_update_is_in_progress_and_when_no_server_is_connected",
    "tests/server/test_page.py",
    "tests/deploy/test_monitoring.py::test_promtool_accepts_the_prometheus_config",
    "tests/deploy/test_monitoring.py::test_dashboard_queries_are_promql",
    "tests/server/test_node_client.py",
]


def bare_path(tmp_path: Path, *commands: str) -> str:
    """A PATH with only these commands (the rest of the system's, chromium, promtool and node included, is not
    there)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in commands:
        (bare / name).symlink_to(shutil.which(name))
    return str(bare)


@pytest.mark.slow
def test_tests_needing_chromium_promtool_or_node_skip_with_the_reason(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PATH"] = bare_path(tmp_path, "python3")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *NEEDS_COMMANDS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    # Every test of those files skipped, none run: the summary counts skips alone.
    assert result.returncode == 0 and re.fullmatch(r"\d+ skipped in .*", output.splitlines()[-1]), output
    for command, package in (("chromium", "chromium"), ("promtool", "prometheus"), ("node", "nodejs")):
        assert f"{command} is not installed: `.ci/system-packages` installs it (Debian package {package})" in output


@pytest.mark.parametrize(("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_a_missing_command_skips_its_test_but_fails_it_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no-such-command is not installed"):
        required_command("no-such-command", "no-such-package")
    assert required_command("python3", "python3") == shutil.which("python3")


def test_the_package_script_installs_nothing_where_it_cannot_and_says_so(tmp_path):
    result = subprocess.run(
        [ROOT / ".ci" / "system-packages"],
        env={"PATH": bare_path(tmp_path, "bash", "python3", "id", "env")},  # no apt-get, chromium, promtool, node, npm
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "no apt-get here: not installing" in result.stderr and "chromium nodejs npm prometheus" in result.stderr
