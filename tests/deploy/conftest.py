"""The deployment files as data: the Dockerfile's instructions, the compose files, and each rlgate
container's environment and settings as its process would read them. Nothing here needs Docker."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings
from support.compose import interpolate

from rlgate.client.settings import ClientSettings
from rlgate.learner.settings import LearnerSettings
from rlgate.server.settings import ServerSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOKEN_FILE = Path(__file__).parent / "example-token"  # a stand-in for the mounted secret, see set_token_file
# The settings class each `rlgate` subcommand reads.
SETTINGS: dict[str, type[BaseSettings]] = {"serve": ServerSettings, "learn": LearnerSettings, "env": ClientSettings}


@dataclass
class Container:
    """One rlgate service as it runs: its subcommand, its RLGATE_ environment and the settings it reads."""

    command: str
    env: dict[str, str]
    settings: BaseSettings


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with comment lines dropped and continuation lines joined."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            keyword, _, arguments = line.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment:` (mapping form), interpolated."""
    return {name: interpolate(value) for name, value in (service.get("environment") or {}).items()}


@pytest.fixture(scope="session")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions((DEPLOY.parent / "Dockerfile").read_text())


@pytest.fixture(scope="session")
def final_stage(dockerfile: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The runtime stage: the instructions after the last FROM."""
    last_from = max(i for i, (keyword, _) in enumerate(dockerfile) if keyword == "FROM")
    return dockerfile[last_from + 1 :]


@pytest.fixture(scope="session")
def image_env(final_stage: list[tuple[str, str]]) -> dict[str, str]:
    """The ENV of the runtime stage (KEY=VALUE form)."""
    words = [word for keyword, arguments in final_stage if keyword == "ENV" for word in shlex.split(arguments)]
    return dict(word.split("=", 1) for word in words)


@pytest.fixture(scope="session")
def healthcheck_argv(final_stage: list[tuple[str, str]]) -> list[str]:
    """The exec-form command of the image's HEALTHCHECK (its --options stripped)."""
    (arguments,) = [arguments for keyword, arguments in final_stage if keyword == "HEALTHCHECK"]
    return json.loads(arguments[arguments.index("CMD") + len("CMD") :])


@pytest.fixture(scope="session")
def healthcheck_default_port(healthcheck_argv: list[str]) -> int:
    """The HTTP port the image's healthcheck probes when RLGATE_HTTP_PORT is not set."""
    match = re.search(r"os\.environ\.get\('RLGATE_HTTP_PORT', '(\d+)'\)", healthcheck_argv[-1])
    assert match, healthcheck_argv
    return int(match.group(1))


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


@pytest.fixture(scope="session")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def override_services(name: str) -> dict[str, dict[str, Any]]:
    """The services of the override file `docker-compose.NAME.yml`."""
    return yaml.safe_load((DEPLOY / f"docker-compose.{name}.yml").read_text())["services"]


@pytest.fixture(scope="session")
def gpu_services() -> dict[str, dict[str, Any]]:
    return override_services("gpu")


def _containers(
    services: dict[str, dict[str, Any]],
    image_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, dict[str, Any]],
) -> dict[str, Container]:
    """The services that run the rlgate image; each one's environment is the image's ENV, then its own
    `environment:`, then an override file's."""
    containers = {}
    for name, service in services.items():
        if "build" not in service:
            continue
        command = service.get("command", ["rlgate", "serve"])
        assert command[0] == "rlgate", f"{name}: {command}"
        env = {key: value for key, value in image_env.items() if key.startswith("RLGATE_")}
        env |= environment(service) | environment(overrides.get(name, {}))
        _clear_rlgate_env(monkeypatch)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        set_token_file(env, monkeypatch)
        containers[name] = Container(command[1], env, SETTINGS[command[1]]())
    _clear_rlgate_env(monkeypatch)
    return containers


def set_token_file(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings read RLGATE_TOKEN_FILE when they are made; the path is the container's (a mounted secret),
    so here it points at a file with a token."""
    if "RLGATE_TOKEN_FILE" in env:
        monkeypatch.setenv("RLGATE_TOKEN_FILE", str(TOKEN_FILE))


def _clear_rlgate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [key for key in os.environ if key.startswith("RLGATE_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def containers(
    services: dict[str, dict[str, Any]], image_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Container]:
    return _containers(services, image_env, monkeypatch, overrides={})


@pytest.fixture
def containers_with(
    services: dict[str, dict[str, Any]], image_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], dict[str, Container]]:
    """containers_with(NAME): the containers of `docker-compose.yml` with `docker-compose.NAME.yml` on top."""
    return lambda name: _containers(services, image_env, monkeypatch, overrides=override_services(name))
