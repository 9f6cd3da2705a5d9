"""One installed import name, `rlgate`, and nothing a user's own packages can shadow or be shadowed by."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_for_the_build() -> None:
    """A folder with an __init__.py under a mapped room that pyproject does not list would be left out."""
    found = set()
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    assert found == set(SETUPTOOLS["packages"])


def test_the_development_install_is_a_plain_folder_static_tools_can_read() -> None:
    """Each room imports from a plain path entry (dev/link_tree.py's tree), not from setuptools' import hook, which
    mypy and IDEs cannot follow: the file a room's module comes from is the working tree's own."""
    for name, folder in SETUPTOOLS["package-dir"].items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        origin = Path(spec.origin)
        assert origin.resolve() == (ROOT / folder / "__init__.py").resolve(), name
        tree = origin.parents[len(name.split("."))]
        assert str(tree) in sys.path, f"{name} comes from {origin}, not from a folder on sys.path"


def test_the_installed_distribution_has_one_top_level_name() -> None:
    top_level = importlib.metadata.distribution("rlgate").read_text("top_level.txt")
    assert top_level is not None and top_level.split() == ["rlgate"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout: setuptools writes its `build/` and `*.egg-info` beside the
    sources, and a `build/` left by an earlier build would put modules since deleted into this one."""
    source, out = tmp_path_factory.mktemp("source") / "rlgate", tmp_path_factory.mktemp("wheel")
    ignored = shutil.ignore_patterns(".*", "build", "*.egg-info", "node_modules", "__pycache__")
    shutil.copytree(ROOT, source, ignore=ignored)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("rlgate-*.whl")
    return found


def test_the_wheel_holds_only_rlgate_and_its_metadata(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"rlgate", "rlgate-0.1.0.dist-info"}
    for module in ("rlgate/server/main.py", "rlgate/core/codec.py", "rlgate/v1/policy_pb2.py", "rlgate/__main__.py"):
        assert module in names
    assert "rlgate/v1/policy.proto" in names  # other languages' clients need the contract
    # The live pages and the chart library they load, with its licence.
    for data in ("service/static/uPlot.iife.min.js", "service/static/uPlot-LICENSE.txt", "service/static/rlgate.js"):
        assert f"rlgate/{data}" in names
    assert {"rlgate/learner/page.html", "rlgate/server/page.html"} <= set(names)
    assert not any(name.startswith(("rlgate/tests", "tests/")) for name in names)


@pytest.mark.slow
def test_from_the_wheel_rlgate_imports_and_server_does_not(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    probe = (
        "import importlib.util, rlgate, rlgate.cli.main, rlgate.server.main\n"
        "print(rlgate.__file__)\n"
        "print([n for n in ('server', 'models', 'episodes', 'connectors', 'learner', 'client', 'bench') "
        "if importlib.util.find_spec(n)])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    location, shadows = ran.stdout.splitlines()
    assert location.startswith(str(site))
    assert shadows == "[]"


@pytest.mark.slow
def test_a_user_project_with_its_own_models_and_server_packages_runs_rlgate_up(tmp_path: Path) -> None:
    """The user's `models/`, `server/` and `episodes/` come first on sys.path; rlgate must never import them."""
    for name in ("models", "server", "episodes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user project\\'s own {name}')\n")
    command = [sys.executable, "-m", "rlgate", "up", "--env", "CartPole-v1", "--seed", "0", "--stop-return", "15"]
    command += ["--run-dir", str(tmp_path / "runs")]
    ran = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    logs = "\n".join(p.read_text() for p in (tmp_path / "runs").rglob("*.log"))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:] + logs[-3000:]
    assert "reached return" in ran.stdout
    assert "the user project" not in logs + ran.stderr


def test_import_rlgate_stays_light_and_names_the_public_api() -> None:
    """The command line imports `rlgate` first: it must not pull in torch; the public names load on first use."""
    probe = (
        "import sys, rlgate, rlgate.cli.main\n"
        "print('torch' in sys.modules)\n"
        "print(rlgate.Policy.__module__, rlgate.read_episodes.__module__, 'torch' in sys.modules)\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["False", "rlgate.policy.policy rlgate.storage.episode_files True"]
