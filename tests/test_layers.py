"""The layers never run backwards: every import in rlgate goes down a layer (or stays in its own room).

v1 <- core <- episodes <- connectors, models <- spec, service, delivery <- export <- policy <- server, learner,
client <- bench <- cli.
Rooms in one layer do not import each other (the server never imports the learner, nor the learner the
server), except for names used only in type annotations (`if TYPE_CHECKING:` blocks), which never run.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. `rlgate` itself (proto/rlgate/__init__.py, __main__.py) is the top: `python -m rlgate` runs the cli.
LAYERS: list[set[str]] = [
    {"v1"},
    {"core"},
    {"episodes"},
    {"connectors", "models", "envs"},
    {"spec", "service", "delivery"},
    {"storage"},
    {"export"},
    {"policy"},
    {"server", "learner", "client"},
    {"bench"},
    {"cli", ""},
]
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def rooms() -> dict[str, Path]:
    """Room name (`server` for `rlgate.server`, "" for the package itself) -> its folder, from pyproject."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {name.removeprefix("rlgate").removeprefix("."): ROOT / folder for name, folder in mapping.items()}
    return {**found, "v1": found[""] / "v1"}


def room_of(module: str) -> str | None:
    """The room an absolute module name belongs to, or None outside rlgate."""
    parts = module.split(".")
    if parts[0] != "rlgate":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in RANK else ""


def runtime_imports(tree: ast.Module) -> list[tuple[int, str, bool]]:
    """(line, imported module, type-only) for every import; type-only: inside `if TYPE_CHECKING:`."""
    type_only_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                type_only_lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, node.lineno in type_only_lines) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name, node.lineno in type_only_lines) for name in names]
    return found


def violations(files: dict[Path, str], root: Path = ROOT) -> list[str]:
    """One message per import that runs up a layer or across to another room of the same layer; each file named
    from `root`."""
    messages = []
    for path, room in files.items():
        for line, module, type_only in runtime_imports(ast.parse(path.read_text(), str(path))):
            target = room_of(module)
            if target is None or target == room:
                continue
            if room == "" and target == "cli":  # `python -m rlgate` runs the command line
                continue
            where = f"{path.relative_to(root)}:{line} imports {module}"
            if RANK[target] > RANK[room]:
                messages.append(f"{where}: rlgate.{room} may not import a layer above it (rlgate.{target})")
            elif RANK[target] == RANK[room] and not type_only:
                messages.append(
                    f"{where}: rlgate.{room} and rlgate.{target} are rooms of one layer and do not import each "
                    "other (only type annotations may, under `if TYPE_CHECKING:`)"
                )
    return messages


def package_files() -> dict[Path, str]:
    """Every Python file of rlgate (generated stubs included) -> its room."""
    files = {}
    for room, folder in rooms().items():
        pattern = "*.py" if room == "" else "**/*.py"
        for path in folder.glob(pattern):
            files[path] = room
    return files


def test_every_room_has_a_layer() -> None:
    assert set(rooms()) == set(RANK), "a room in pyproject's package-dir has no layer here (or vice versa)"


def test_no_import_runs_up_a_layer_or_across_a_layer() -> None:
    assert violations(package_files()) == []


@pytest.mark.parametrize(
    ("room", "source", "rule"),
    [
        ("server", "from rlgate.learner.intake import Intake\n", "rooms of one layer"),
        ("episodes", "import rlgate.connectors.columns\n", "may not import a layer above"),
        ("core", "from rlgate.episodes import SingleAgentEpisode\n", "may not import a layer above"),
        ("learner", "from rlgate import server\n", "rooms of one layer"),
    ],
)
def test_a_back_edge_is_reported_with_its_file_and_rule(tmp_path: Path, room: str, source: str, rule: str) -> None:
    path = probe(tmp_path, room, source)
    found = violations({path: room}, root=tmp_path)
    assert len(found) == 1
    assert f"{room}/_layer_probe.py:1" in found[0] and rule in found[0]


def test_type_only_imports_across_a_layer_are_allowed_but_not_upwards(tmp_path: Path) -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlgate.models import RLModule\n"
    path = probe(tmp_path, "connectors", source)
    assert violations({path: "connectors"}, root=tmp_path) == []
    path.write_text(source.replace("rlgate.models import RLModule", "rlgate.server import main"))
    assert len(violations({path: "connectors"}, root=tmp_path)) == 1


def probe(root: Path, room: str, source: str) -> Path:
    """`source` as ROOM/_layer_probe.py under `root` (a tmp_path): one written into the tree was read, half-written
    or gone, by another worker's test_no_import_runs_up_a_layer_or_across_a_layer."""
    path = root / room / "_layer_probe.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path
