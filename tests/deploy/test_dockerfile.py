"""The Dockerfile and .dockerignore, read as text: what they name must exist in the code, and the
HEALTHCHECK command is run for real against a service's HTTP app."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tomllib
from pathlib import Path

from rlgate.cli.main import COMMANDS
from rlgate.learner.settings import LearnerSettings
from rlgate.server.metrics import ServerMetrics
from rlgate.server.settings import ServerSettings
from rlgate.service.http import HttpServer, build_app

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PORTS = ("port", "http_port")


def arguments_of(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [arguments for k, arguments in instructions if k == keyword]


def test_builder_and_runtime_stages_share_the_python_base(dockerfile: list[tuple[str, str]]) -> None:
    """The venv built in the builder stage only runs on the interpreter it was made with."""
    first_from = next(i for i, (keyword, _) in enumerate(dockerfile) if keyword == "FROM")
    global_args = dict(arguments.split("=", 1) for arguments in arguments_of(dockerfile[:first_from], "ARG"))
    froms = arguments_of(dockerfile, "FROM")
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], line.split()[0]) for line in froms]
    assert bases == ["python:3.11-slim", "python:3.11-slim"]
    assert froms[0].endswith(" AS builder")


def test_runtime_stage_gets_the_venv_and_runs_as_non_root(
    final_stage: list[tuple[str, str]], image_env: dict[str, str]
) -> None:
    copies = arguments_of(final_stage, "COPY")
    assert "--from=builder /opt/venv /opt/venv" in copies
    assert image_env["PATH"].startswith("/opt/venv/bin:")
    (user,) = arguments_of(final_stage, "USER")
    assert user.split(":")[0] not in ("root", "0")
    assert image_env["RLGATE_HOST"] == "0.0.0.0", "services must listen beyond the container's loopback"


def test_every_pip_install_honours_the_constraints(dockerfile: list[tuple[str, str]]) -> None:
    installs = [run for run in arguments_of(dockerfile, "RUN") if "pip install" in run]
    assert installs
    for run in installs:
        assert re.search(r"(--constraint|-c) constraints\.txt", run), run


def test_torch_comes_from_the_cpu_index_unless_told_otherwise(dockerfile: list[tuple[str, str]]) -> None:
    """CPU torch by default; `--build-arg TORCH_INDEX_URL=.../whl/cu128` makes a CUDA image."""
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in arguments_of(dockerfile, "ARG")
    (torch_install,) = [run for run in arguments_of(dockerfile, "RUN") if run.endswith(" torch")]
    assert '--index-url "$TORCH_INDEX_URL"' in torch_install


def test_cmd_runs_an_existing_subcommand(final_stage: list[tuple[str, str]]) -> None:
    (cmd,) = arguments_of(final_stage, "CMD")
    argv = json.loads(cmd)  # exec form: the service is PID 1 and gets SIGTERM itself
    assert argv[0] in PYPROJECT["project"]["scripts"]
    assert argv[1] in COMMANDS


def test_exposed_ports_are_the_settings_defaults(final_stage: list[tuple[str, str]]) -> None:
    exposed = {int(port) for line in arguments_of(final_stage, "EXPOSE") for port in line.split()}
    defaults = [cls.model_fields[field].default for cls in (ServerSettings, LearnerSettings) for field in PORTS]
    assert exposed == set(defaults)


def test_healthcheck_default_port_is_the_servers(healthcheck_default_port: int) -> None:
    """The image's CMD is `rlgate serve`, so without RLGATE_HTTP_PORT the probe must hit its port."""
    assert healthcheck_default_port == ServerSettings.model_fields["http_port"].default


async def _exit_code(argv: list[str], http_port: int) -> int:
    process = await asyncio.create_subprocess_exec(*argv, env={"RLGATE_HTTP_PORT": str(http_port)})
    return await asyncio.wait_for(process.wait(), timeout=20)


async def test_healthcheck_passes_on_a_live_service_and_fails_without_one(healthcheck_argv: list[str]) -> None:
    """The image's HEALTHCHECK, run as Docker runs it, against the HTTP app every service serves."""
    assert healthcheck_argv[0] == "python"
    argv = [sys.executable, *healthcheck_argv[1:]]
    app = build_app("test", registry=ServerMetrics().registry, status=dict, ready=lambda: (True, None))
    http = HttpServer(app, "127.0.0.1", 0)
    http.start()
    try:
        assert await _exit_code(argv, http.port) == 0
    finally:
        await http.stop()
    assert await _exit_code(argv, http.port) != 0


def _ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled by _ignored"
    return patterns


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: a path is left out when a pattern matches it or one of its parent folders."""

    def regex(pattern: str) -> re.Pattern[str]:
        parts = re.split(r"(\*\*/|\*|\?)", pattern)
        table = {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}
        return re.compile("".join(table.get(part, re.escape(part)) for part in parts))

    parents = ["/".join(path.split("/")[: i + 1]) for i in range(path.count("/") + 1)]
    return any(regex(pattern).fullmatch(parent) for pattern in patterns for parent in parents)


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = _ignore_patterns()
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        "spool/0a1b-0.pb",
        "checkpoints/000010/weights.safetensors",
        "runs/cartpole.log",
        "server/__pycache__/main.cpython-311.pyc",
        ".pytest_cache/README.md",
        ".ruff_cache/CACHEDIR.TAG",
        ".hypothesis/examples/x",
    ):
        assert _ignored(path, patterns), path


def test_dockerignore_keeps_what_the_build_needs() -> None:
    """pyproject.toml, its readme, constraints.txt and the .py and .proto files of the wheel's packages."""
    patterns = _ignore_patterns()
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    sources = [Path(p) for p in ("pyproject.toml", PYPROJECT["project"]["readme"], "constraints.txt")]
    for package in folders:
        sources += [path.relative_to(REPO) for path in (REPO / package).rglob("*.py")]
        sources += [path.relative_to(REPO) for path in (REPO / package).rglob("*.proto")]
    assert len(sources) > 10
    for path in sources:
        assert not _ignored(path.as_posix(), patterns), path
