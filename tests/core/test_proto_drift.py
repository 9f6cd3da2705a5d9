"""The committed stubs must be exactly what `make proto` generates from the committed .proto files."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "proto" / "rlgate" / "v1"
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
