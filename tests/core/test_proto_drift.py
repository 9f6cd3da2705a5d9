"""The committed stubs must be exactly what `make proto` generates from the committed .proto files."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "proto" / "rlgate" / "v1"
HEALTH_PROTO = Path("grpc/health/v1/health.proto")  # vendored for other languages' clients, not compiled here
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    plugins = [bin_dir / "protoc-gen-mypy", bin_dir / "protoc-gen-mypy_grpc"]
    if not all(p.exists() for p in plugins):
        pytest.fail("mypy-protobuf is not installed: install the dev extra (make test does)")
    shutil.copytree(
        ROOT / "proto",
        tmp_path / "proto",
        ignore=shutil.ignore_patterns(*[f"*{s}" for s in GENERATED_SUFFIXES]),
    )
    protos = sorted(str(p.relative_to(tmp_path / "proto")) for p in (tmp_path / "proto/rlgate/v1").glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            f"--plugin=protoc-gen-mypy={plugins[0]}",
            f"--plugin=protoc-gen-mypy_grpc={plugins[1]}",
            "--python_out=.",
            "--grpc_python_out=.",
            "--mypy_out=.",
            "--mypy_grpc_out=.",
            *protos,
        ],
        cwd=tmp_path / "proto",
        check=True,
        capture_output=True,
    )
    fresh = {
        p.name: p.read_text() for p in (tmp_path / "proto/rlgate/v1").iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    }
    committed = {p.name: p.read_text() for p in STUBS.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
    assert sorted(fresh) == sorted(committed), "stub files differ from the protos: run `make proto`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit the result"


def test_the_vendored_health_proto_is_the_health_service_the_servers_run(tmp_path: Path) -> None:
    """The vendored health.proto describes the health service the servers run (grpcio-health-checking's)."""
    from google.protobuf import descriptor_pb2
    from grpc_health.v1 import health_pb2

    out = tmp_path / "health.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--descriptor_set_out={out}", str(HEALTH_PROTO)],
        cwd=ROOT / "proto",
        check=True,
        capture_output=True,
    )
    (vendored,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    served = descriptor_pb2.FileDescriptorProto.FromString(health_pb2.DESCRIPTOR.serialized_pb)
    for descriptor in (vendored, served):
        descriptor.ClearField("name")  # grpc_health/v1/health.proto in the Python package
        for message in [*descriptor.message_type, *(n for m in descriptor.message_type for n in m.nested_type)]:
            for field in message.field:
                field.ClearField("json_name")  # protoc's descriptor sets add it, Python's embedded one leaves it out
    assert vendored == served, "proto/grpc/health/v1/health.proto differs from the served health service: update it"
