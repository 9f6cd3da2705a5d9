"""Every user error of the command line, as a real `rlgate` process: one line `rlgate: ...`, exit 2, no traceback."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from rlgate.core.errors import UserError
from rlgate.service.process import start_grpc_server
from tests.support.cli import ROOT, rlgate


def one_user_error(code: int, stderr: str) -> str:
    """The single `rlgate: ...` line of a run that must have ended with a user error."""
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("rlgate: ")]
    assert len(lines) == 1, stderr
    assert stderr.rstrip().endswith(lines[0]), stderr  # the last word
    return lines[0]


@pytest.fixture
def held_port() -> int:
    """A port some other process listens on (here: a plain socket)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.mark.timeout(300)
async def test_each_user_error_is_one_line_and_exit_2(tmp_path: Path, held_port: int) -> None:
    free = ("--port", "0", "--http-port", "0")
    nowhere = tmp_path / "nothing-here"
    cases = {  # arguments -> what the line must say
        ("serve", "--env", "NoSuchEnv-v0", *free): "env.id: Environment `NoSuchEnv` doesn't exist",
        ("serve", "--max-batch-size", "0"): "--max-batch-size: input should be greater than or equal to 1 (got '0')",
        ("learn", "--spec.algorithm.train-batch-size", "x"): "--spec.algorithm.train-batch-size: input should be",
        ("serve", "--no-such-flag", "1"): "unrecognized arguments: --no-such-flag 1",
        ("serve", "--tls-cert", str(nowhere), "--tls-key", str(nowhere)): "--tls-cert: path does not point to a file",
        ("serve", "--checkpoint", str(nowhere), *free): f"no checkpoint in {nowhere}",
        ("serve", "--port", str(held_port), "--http-port", "0"): f"127.0.0.1:{held_port} (--port): Address already",
        ("serve", "--port", "0", "--http-port", str(held_port)): f"{held_port} (--http-port): Address already in use",
        ("serve", "--workers", "2", "--port", str(held_port), "--http-port", "0"): f"{held_port} (--port): Address",
        ("serve", "--workers", "2", "--port", "0", "--http-port", str(held_port)): "(--http-port): Address already",
        ("serve", "--workers", "2", "--http-port", "65535"): "--http-port 65535 + 2 workers: their ports pass 65535",
        ("learn", "--env", "CartPole-v1", "--port", str(held_port), "--http-port", "0"): "(--port): Address already",
        ("learn", *free, "--checkpoint-dir", str(nowhere)): f"no checkpoint in {nowhere} and no run spec",
        ("up", "--num-clients", "0"): "--num-clients: input should be greater than or equal to 1",
        ("up", "--seed", "-1"): "--spec.seed: input should be greater than or equal to 0",
        # Found before the run starts: the module, not "no reward_threshold".
        ("up", "--env", "nosuchpkg.mod:Foo", "--run-dir", str(tmp_path)): "env.id: cannot import 'nosuchpkg.mod'",
        # Found by a child (learner or server): its own line, with where its log is.
        ("up", "--spec.model.module-class", "nosuch.mod:X", "--stop-return", "1", "--run-dir", str(tmp_path)): (
            "model.module_class: cannot import 'nosuch.mod': No module named 'nosuch' (log: "
        ),
        ("env", "--config", str(nowhere)): f"{nowhere}: No such file or directory",
        ("env", "--env", "NoSuchEnv-v0", "--num-clients", "2"): "env.id: Environment `NoSuchEnv` doesn't exist",
    }
    # Concurrently: each is a Python start-up, most of it waiting on imports.
    results = await asyncio.gather(*(rlgate(*args) for args in cases))
    for (args, expected), (code, stderr) in zip(cases.items(), results, strict=True):
        assert expected in one_user_error(code, stderr), (args, stderr)


async def test_a_second_server_on_a_port_in_use_fails_at_once(server) -> None:
    """gRPC shares ports by default (SO_REUSEPORT): a second `rlgate serve` would split the clients."""
    code, stderr = await rlgate("serve", "--port", str(server.port), "--http-port", "0", "--env", "CartPole-v1")
    assert f"cannot listen on 127.0.0.1:{server.port} (--port): Address already in use" in one_user_error(code, stderr)


async def test_grpc_ports_are_shared_only_when_asked_for() -> None:
    """Off by default; `reuse_port=True` lets worker processes of one server share a port on purpose."""
    from grpc_health.v1 import health

    servers = []

    async def start(port: int, reuse_port: bool) -> int:
        server, bound = await start_grpc_server(
            "x",
            lambda _: None,
            health.aio.HealthServicer(),
            address=f"127.0.0.1:{port}",
            max_message_bytes=1024,
            reuse_port=reuse_port,
        )
        servers.append(server)
        return bound

    try:
        port = await start(0, reuse_port=False)
        with pytest.raises(UserError, match=f"127.0.0.1:{port} \\(--port\\): Address already in use"):
            await start(port, reuse_port=False)
        shared = await start(0, reuse_port=True)
        assert await start(shared, reuse_port=True) == shared
    finally:
        for server in servers:
            await server.stop(None)


async def test_rlgate_env_prints_the_servers_refusal_once(server_factory) -> None:
    server = await server_factory(env="CartPole-v1")
    args = ("env", "--server", f"127.0.0.1:{server.port}", "--env", "Acrobot-v1", "--num-clients", "3")
    line = one_user_error(*await rlgate(*args))
    assert line.startswith(f"rlgate: the server at 127.0.0.1:{server.port} refused the stream: ")
    assert line.endswith("action_space.n: 2 != 3")  # the server's own words: Acrobot's 3 actions, the model's 2


async def test_rlgate_env_gives_up_on_an_address_where_no_server_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]  # closed again: nobody listens there
    code, stderr = await rlgate("env", "--server", f"127.0.0.1:{port}", "--connect-timeout-s", "1", "--no-progress")
    assert one_user_error(code, stderr) == f"rlgate: cannot reach the server at 127.0.0.1:{port} within 1 s"


async def test_rlgate_env_names_the_env_and_what_is_wrong_with_it(server, tmp_path: Path) -> None:
    """An env that raises or breaks gymnasium's contract, or a module that fails to import: one line each."""
    (tmp_path / "broken_syntax.py").write_text("def (:\n")
    (tmp_path / "broken_raise.py").write_text("raise RuntimeError('needs MUJOCO_KEY set')\n")
    run = ("--server", f"127.0.0.1:{server.port}", "--max-steps", "100", "--no-progress")
    envs = "tests.support.bad_envs"
    cases = [  # (env, its kwargs, working directory) -> what the line must say
        ((f"{envs}:Steps", '{"nope": 1}', ROOT), f"env {envs}:Steps: __init__() raised TypeError: "),
        ((f"{envs}:Steps", '{"fail_at": 5}', ROOT), f"env {envs}:Steps: step() raised RuntimeError: simulator crashed"),
        ((f"{envs}:NotAnEnv", "{}", ROOT), f"env {envs}:NotAnEnv: made 'NotAnEnv', which is not a gymnasium.Env"),
        ((f"{envs}:OldGymApi", "{}", ROOT), "reset() returned ndarray, not the 2 values of gymnasium's API"),
        ((f"{envs}:WrongShape", "{}", ROOT), "step() returned an observation of shape (5,), but its observation space"),
        (("broken_syntax:Env", "{}", tmp_path), "env.id: cannot import 'broken_syntax': SyntaxError: invalid syntax"),
        (("broken_raise:Env", "{}", tmp_path), "env.id: cannot import 'broken_raise': RuntimeError: needs MUJOCO_KEY"),
    ]
    results = await asyncio.gather(
        *(rlgate("env", "--env", env, "--spec.env.kwargs", kwargs, *run, cwd=cwd) for (env, kwargs, cwd), _ in cases)
    )
    for ((env, _, _), expected), (code, stderr) in zip(cases, results, strict=True):
        assert expected in one_user_error(code, stderr), (env, stderr)
