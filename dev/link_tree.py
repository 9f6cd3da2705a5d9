"""The development install's package tree: `rlgate` as links to the room folders, on the venv's path.

pyproject.toml maps each top-level folder into one package (`core/` is `rlgate.core`, ...). pip's editable
install maps them with an import hook, which static tools (mypy, IDEs, language servers) cannot follow. This
writes `VENV/rlgate-tree/rlgate/` with one link per room (a link to the folder itself, so a new module in a room
needs nothing) and a `.pth` file that puts the tree on the venv's path, ahead of the hook: what runs and what the
tools read are the working tree's own files. Run by `make` after `pip install --editable .`; again only when a
room is added. Usage: `python dev/link_tree.py VENV`.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def link_tree(venv: Path) -> Path:
    """Write the tree and its .pth file into `venv`; returns the tree's folder (the one on the path)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    tree = venv.resolve() / "rlgate-tree"
    shutil.rmtree(tree, ignore_errors=True)
    package = tree / "rlgate"
    package.mkdir(parents=True)
    for entry in (ROOT / mapping["rlgate"]).iterdir():  # the package's own files and rlgate.v1
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name != "rlgate":
            (package / name.removeprefix("rlgate.")).symlink_to(ROOT / folder, target_is_directory=True)
    (site_packages(venv) / "rlgate-tree.pth").write_text(f"{tree}\n")
    return tree


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"{venv}: no lib/python3*/site-packages (not a virtual environment?)")
    return found[0]


if __name__ == "__main__":
    print(link_tree(Path(sys.argv[1])))
