"""requirements/*.txt, the image's lock files (`make lock`): every package pinned with its hashes, and in step
with pyproject.toml's dependencies and constraints.txt's pins, so a changed dependency cannot be forgotten there."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKS = {"cpu": REPO / "requirements" / "cpu.txt", "cuda": REPO / "requirements" / "cuda.txt"}


def locked(path: Path) -> dict[str, tuple[Version, list[str], list[str]]]:
    """name -> (pinned version, sha256 hashes, what it is there for: the `# via` lines) of a uv/pip-compile lock."""
    entries: dict[str, tuple[Version, list[str], list[str]]] = {}
    for block in re.split(r"\n(?=\S)", path.read_text()):
        if block.startswith("#"):
            continue
        name, version = re.match(r"([\w.-]+)==(\S+)", block).groups()
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        comments = [line.split("#", 1)[1].strip() for line in block.splitlines() if line.lstrip().startswith("#")]
        via = [reason for comment in comments if (reason := comment.removeprefix("via").strip())]
        entries[canonicalize_name(name)] = (Version(version), hashes, via)
    return entries


def constraints() -> dict[str, Version]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(pin.name): Version(str(pin.specifier).removeprefix("==")) for pin in pins}


@pytest.fixture(params=sorted(LOCKS), scope="module")
def lock(request: pytest.FixtureRequest) -> dict[str, tuple[Version, list[str], list[str]]]:
    return locked(LOCKS[request.param])


def test_every_package_is_pinned_with_hashes(lock: dict) -> None:
    """pip's --require-hashes (the Dockerfile's install) refuses anything else."""
    assert len(lock) > 20
    for name, (_, hashes, _) in lock.items():
        assert hashes, name


def test_lock_holds_exactly_pyprojects_dependencies(lock: dict) -> None:
    """Each dependency of pyproject.toml (names and extras) is locked at a version it allows, and every locked
    package is there for one of them (no leftovers of a removed dependency)."""
    requirements = [Requirement(text) for text in PYPROJECT["project"]["dependencies"]]
    assert all(not r.extras and not r.marker for r in requirements), "extras and markers need locks that cover them"
    direct = {name for name, (_, _, via) in lock.items() if "rlgate (pyproject.toml)" in via}
    assert direct == {canonicalize_name(r.name) for r in requirements}
    for requirement in requirements:
        version = lock[canonicalize_name(requirement.name)][0]
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)
    for name, (_, _, via) in lock.items():
        assert via, f"{name} is in the lock for nothing"


def test_lock_honours_the_constraints(lock: dict) -> None:
    for name, version in constraints().items():
        if name in lock:
            assert lock[name][0].public == str(version), name


def test_lock_has_the_build_backend(lock: dict) -> None:
    """The Dockerfile builds rlgate without build isolation, with the locked setuptools."""
    (backend,) = [Requirement(text) for text in PYPROJECT["build-system"]["requires"]]
    assert backend.specifier.contains(lock[canonicalize_name(backend.name)][0])


def test_cpu_lock_has_cpu_torch_and_cuda_lock_cuda_torch() -> None:
    cpu, cuda = locked(LOCKS["cpu"]), locked(LOCKS["cuda"])
    assert cpu["torch"][0] == Version(f"{constraints()['torch']}+cpu")
    assert not any(name.startswith("nvidia-") for name in cpu)
    assert cuda["torch"][0] == constraints()["torch"]  # PyPI's Linux build of torch is the CUDA one
    assert any(name.startswith("nvidia-") for name in cuda)
    assert cpu.keys() <= cuda.keys()
