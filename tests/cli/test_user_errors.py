"""Every user error of the command line, as a real `rlgate` process: one line `rlgate: ...`, exit 2, no traceback."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from rlgate.cli.up import _new_run_directory
from rlgate.core.errors import UserError
from rlgate.models import weights_to_bytes
from rlgate.service.process import start_grpc_server
from rlgate.spec.build import build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from tests.support.cli import ROOT, rlgate

MULTI_BINARY = "tests.support.odd_envs:MultiBinaryActions"
BAD = "tests.support.bad_envs"
WRONG = "tests.support.wrong_module"
NO_MULTI_BINARY = "The default model does not support the action space MultiBinary(3)"


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


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_each_user_error_is_one_line_and_exit_2(tmp_path: Path, held_port: int) -> None:
    free = ("--port", "0", "--http-port", "0")
    in_tmp = ("--run-dir", str(tmp_path))
    nowhere = tmp_path / "nothing-here"
    a_file = tmp_path / "a-file"
    a_file.write_text("neither a directory nor a certificate\n")
    is_a_file = "path points to a file, not a directory (got"
    bad_yaml, not_utf8, typo = tmp_path / "bad.yaml", tmp_path / "not-utf8.toml", tmp_path / "typo.toml"
    bad_yaml.write_text("env:\n  id: CartPole-v1\n  num_envs: 2: 3\n")
    not_utf8.write_bytes(b"\xff\xfe[env]\n")
    typo.write_text("[model.config]\nfcnet_hidden = [64]\n")
    my = tmp_path / "my.toml"
    my.write_text("[env]\nnum_env = 4\n[algoritm]\nlr = 0.1\n")
    in_my = f"{my}: [env] num_env: unknown key (did you mean num_envs?); [algoritm]: unknown section (did you mean "
    cases = {  # arguments -> what the line must say
        ("serve", "--env", "NoSuchEnv-v0", *free): "env.id: Environment `NoSuchEnv` doesn't exist",
        ("serve", "--max-batch-size", "0"): "--max-batch-size: input should be greater than or equal to 1 (got '0')",
        ("learn", "--spec.algorithm.train-batch-size", "x"): "--spec.algorithm.train-batch-size: input should be",
        ("serve", "--no-such-flag", "1"): "unrecognized arguments: --no-such-flag 1",
        ("serve", "--tls-cert", str(nowhere), "--tls-key", str(nowhere)): "--tls-cert: path does not point to a file",
        ("serve", "--checkpoint", str(nowhere), *free): f"no checkpoint at {nowhere}: no such directory",
        ("serve", "--port", str(held_port), "--http-port", "0"): f"127.0.0.1:{held_port} (--port): Address already",
        ("serve", "--port", "0", "--http-port", str(held_port)): f"{held_port} (--http-port): Address already in use",
        ("serve", "--workers", "2", "--port", str(held_port), "--http-port", "0"): f"{held_port} (--port): Address",
        ("serve", "--workers", "2", "--port", "0", "--http-port", str(held_port)): "(--http-port): Address already",
        ("serve", "--workers", "2", "--http-port", "65535"): "--http-port 65535 + 2 workers: their ports pass 65535",
        ("learn", "--env", "CartPole-v1", "--port", str(held_port), "--http-port", "0"): "(--port): Address already",
        ("learn", *free, "--checkpoint-dir", str(nowhere)): f"no checkpoint in {nowhere} and no run spec",
        ("up", "--num-clients", "0"): "--num-clients: input should be greater than or equal to 1",
        ("up", "--seed", "-1"): "--spec.seed: input should be greater than or equal to 0",
        ("up", "--run-dir", str(a_file)): f"--run-dir: {is_a_file}",
        ("up", "--run-dir", str(a_file / "runs")): f"--run-dir {a_file / 'runs'}/CartPole-v1-",
        ("up", "--stop-return", "nan"): "--stop-return: input should be a finite number (got 'nan')",
        ("up", "--stop-return", "inf"): "--stop-return: input should be a finite number (got 'inf')",
        ("up", "--env", f"{BAD}:Steps", *in_tmp): (
            f"{BAD}:Steps has no reward_threshold: pass --stop-return R to stop at a mean return of R, or --max-steps N"
        ),
        # Found before the run starts: the module, not "no reward_threshold".
        ("up", "--env", "nosuchpkg.mod:Foo", "--run-dir", str(tmp_path)): "env.id: cannot import 'nosuchpkg.mod'",
        # Found by a child (learner or server): its own line.
        ("up", "--spec.model.module-class", "nosuch.mod:X", "--stop-return", "1", "--run-dir", str(tmp_path)): (
            "model.module_class: cannot import 'nosuch.mod': No module named 'nosuch'"
        ),
        # A module whose greedy forward gives no action distribution inputs: named with the key, when it is built.
        ("up", "--spec.model.module-class", f"{WRONG}:LogitsNotDistInputs", "--stop-return", "1", *in_tmp): (
            f"'{WRONG}:LogitsNotDistInputs': its forward_inference returned no 'action_dist_inputs'"
        ),
        ("env", "--config", str(nowhere)): f"{nowhere}: No such file or directory",
        ("env", "--env", "NoSuchEnv-v0", "--num-clients", "2"): "env.id: Environment `NoSuchEnv` doesn't exist",
        ("learn", "--env", MULTI_BINARY, *free, "--checkpoint-dir", str(tmp_path / "mb")): NO_MULTI_BINARY,
        ("serve", "--env", MULTI_BINARY, "--allow-import", "tests", *free): NO_MULTI_BINARY,
        # An env that raises when made, found by the process that makes it for its spaces (was a traceback).
        (
            "learn",
            "--env",
            f"{BAD}:Steps",
            "--spec.env.kwargs",
            '{"nope": 1}',
            *free,
            "--checkpoint-dir",
            str(tmp_path / "raises"),
        ): f"env {BAD}:Steps: __init__() raised TypeError: ",
        ("learn", "--checkpoint-dir", str(a_file), *free): f"--checkpoint-dir: {is_a_file}",
        # Env wrappers: one that does not import, one that breaks the spaces, each named.
        ("env", "--spec.env.wrappers", '["tests.support.nosuch:Wrapper"]'): (
            "env.wrappers[0]: cannot import 'tests.support.nosuch'"
        ),
        (
            "learn",
            "--spec.env.wrappers",
            '["tests.support.wrappers:NotASpace"]',
            *free,
            "--checkpoint-dir",
            str(tmp_path / "wrapped"),
        ): "env CartPole-v1, wrapped by env.wrappers[0] (tests.support.wrappers:NotASpace): its observation_space is",
        ("learn", "--log-dir", str(a_file), "--checkpoint-dir", str(tmp_path / "ck"), *free): f"--log-dir: {is_a_file}",
        ("serve", "--spool-dir", str(a_file), *free): f"--spool-dir: {is_a_file}",
        ("serve", "--episode-dir", str(a_file), *free): f"--episode-dir: {is_a_file}",
        (
            "serve",
            "--tls-cert",
            str(a_file),
            "--tls-key",
            str(a_file),
            *free,
        ): f"--tls-key {a_file} are not a valid PEM",
        ("serve", "--server-id", "s" * 201, *free): "--server-id: string should have at most 200 characters",
        ("serve", "--learner", "not a host", *free): "--learner: not a gRPC target: write host:port",
        ("serve", "--learner", "learner:65536", *free): "--learner: not a gRPC target: write host:port",
        ("learn", "--config", str(bad_yaml), *free): "not valid YAML: mapping values are not allowed here (line 3,",
        ("learn", "--config", str(not_utf8), *free): f"{not_utf8}: not UTF-8 text (invalid start byte at byte 0)",
        ("learn", "--config", str(typo), *free): "[model.config] fcnet_hidden: unknown key (did you mean fcnet_hiddens",
        # A typo in a file names the file and its key, whichever command reads it.
        ("learn", "--config", str(my), *free): in_my,
        ("up", "--config", str(my), *in_tmp): in_my,
        ("serve", "--config", str(my), *free): in_my,
        ("env", "--config", str(my)): in_my,
        ("learn", "--algo", "A2C", *free): "--spec.algorithm.name: no algorithm 'A2C': the algorithms are PPO, DQN,",
        ("learn", "--algo", "DQN", "--spec.algorithm.clip-param", "0.1", *free): (
            "--spec.algorithm.clip-param: not a field of DQN (it is PPO's): drop it, or set algorithm.name"
        ),
        ("learn", "--env", "Pendulum-v1", "--algo", "DQN", *free, "--checkpoint-dir", str(tmp_path / "dqn")): (
            "algorithm.name: DQN takes Discrete actions (starting at 0); the env's are Box(-2.0, 2.0, (1,), float32)"
        ),
        ("learn", "--spec", "{bad", *free): "--spec: not valid JSON: Expecting property name enclosed in double quotes",
        ("learn", "--spec.env.kwargs", "notjson", *free): "--spec.env.kwargs: not valid JSON, nor key=value pairs",
        ("eval", "--checkpoint", str(nowhere), "--bogus"): "rlgate: unrecognized arguments: --bogus",
        ("episodes",): "rlgate: the following arguments are required: directory",
        ("bench", "--repeats", "x"): "rlgate: argument --repeats: invalid int value: 'x'",
        ("bench", "--quick", "--warmup-s", "-1"): "--warmup-s must be at least 0, not -1.0",
        ("bench", "--quick", "--window-s", "nan"): "--window-s must be more than 0, not nan",
        ("bench", "--quick", "--repeats", "0"): "--repeats must be at least 1, not 0",
        ("bench", "--quick", "--num-learners", "0"): "--num-learners must be at least 1, not 0",
        ("bench", "--quick", "--json", str(nowhere / "x.json")): "x.json: not a file in an existing directory",
    }
    # Concurrently: each is a Python start-up, most of it waiting on imports.
    results = await asyncio.gather(*(rlgate(*args) for args in cases))
    for (args, expected), (code, stderr) in zip(cases.items(), results, strict=True):
        assert expected in one_user_error(code, stderr), (args, stderr)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_up_refuses_spaces_the_default_model_cannot_take_in_one_line(tmp_path: Path) -> None:
    """Huge spaces are refused before a model is built (it would take minutes and gigabytes); spaces that are not
    numbers are named, not left to fail deep in numpy."""
    odd = "tests.support.odd_envs"
    cases = {
        "HugeDiscreteActions": "would have 65,000,009,025 parameters, more than the 268,435,456 (2**28) rlgate "
        "builds: its largest layer, pi.out.weight, is 1000000000 x 64",
        "HugeMultiDiscreteObservations": "MultiDiscrete([1000000000 1000000000]) flattens into 2,000,000,000 values",
        "TextObservations": "The default model does not support the observation space Text(1, 8,",
        "GraphObservations": "The default model does not support the observation space Graph(Box(",
    }
    results = await asyncio.gather(
        *(rlgate("up", "--env", f"{odd}:{env}", "--stop-return", "1", "--run-dir", str(tmp_path)) for env in cases)
    )
    for (env, expected), (code, stderr) in zip(cases.items(), results, strict=True):
        assert expected in one_user_error(code, stderr), (env, stderr)


@pytest.mark.slow
async def test_a_checkpoint_whose_weights_are_another_models_is_one_line_wherever_it_is_loaded(
    tmp_path: Path,
) -> None:
    """Weights of a 64-unit model under a spec.json that says 32 units: eval, serve and a resuming learner
    name the weights file and the first tensor that differs."""
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    wide = RunSpec.model_validate({"env": {"id": "CartPole-v1"}, "seed": 0})
    narrow = wide.model_copy(update={"model": wide.model.model_copy(update={"config": {"fcnet_hiddens": [32, 32]}})})
    directory = checkpoint.save(
        tmp_path / "checkpoints",
        version=3,
        spec=narrow,
        observation_space=spaces[0],
        action_space=spaces[1],
        weights=weights_to_bytes(build_rl_module(wide, *spaces, ImportPolicy())),
    )
    free = ("--port", "0", "--http-port", "0")
    results = await asyncio.gather(
        rlgate("eval", "--checkpoint", str(tmp_path / "checkpoints"), "--episodes", "1"),
        rlgate("serve", "--checkpoint", str(tmp_path / "checkpoints"), *free),
        rlgate("learn", "--checkpoint-dir", str(tmp_path / "checkpoints"), *free),
    )
    for code, stderr in results:
        assert one_user_error(code, stderr) == (
            f"rlgate: checkpoint file {directory / 'weights.safetensors'} does not fit the model its spec.json "
            "builds: Weights do not fit the module: 'encoder.hidden.0.weight' is torch.float32[64, 4], the module "
            "has torch.float32[32, 4]"
        ), stderr


@pytest.mark.slow
async def test_up_failing_early_removes_only_the_run_directory_it_made(tmp_path: Path) -> None:
    """A new --run-dir (and its parents) goes again; one that held something before stays as it was."""
    new, existing = tmp_path / "new" / "runs", tmp_path / "mine"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me\n")
    bad_env = ("--env", "nosuchpkg.mod:Foo")
    child_fails = ("--spec.model.module-class", "nosuch.mod:X", "--stop-return", "1")
    results = await asyncio.gather(
        rlgate("up", *bad_env, "--run-dir", str(new)),
        rlgate("up", *bad_env, "--run-dir", str(existing)),
        rlgate("up", *child_fails, "--run-dir", str(tmp_path / "child")),
    )
    for code, stderr in results:
        one_user_error(code, stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]


def test_runs_started_in_the_same_second_never_share_a_directory(tmp_path: Path) -> None:
    """Two `up`s of one env in one second: each its own folder (one that fails removes only its own)."""
    name = "CartPole-v1-20260101-120000"
    first, created = _new_run_directory(tmp_path / "runs", name)
    second, created_second = _new_run_directory(tmp_path / "runs", name)
    assert (first.name, second.name) == (name, f"{name}-2")
    assert created == [first, tmp_path / "runs"] and created_second == [second]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
async def test_device_cuda_without_cuda_is_one_line(tmp_path: Path) -> None:
    serve = rlgate("serve", "--env", "CartPole-v1", "--device", "cuda", "--port", "0", "--http-port", "0")
    evaluate = rlgate("eval", "--checkpoint", str(tmp_path), "--device", "cuda")
    learn = rlgate("learn", "--env", "CartPole-v1", "--device", "cuda", "--checkpoint-dir", str(tmp_path / "learn"))
    up = rlgate("up", "--device", "cuda", "--run-dir", str(tmp_path / "runs"))
    for code, stderr in await asyncio.gather(serve, evaluate, learn, up):
        assert one_user_error(code, stderr).startswith("rlgate: --device cuda: CUDA is not available"), stderr
    assert not (tmp_path / "learn").exists() and not (tmp_path / "runs").exists()  # refused before anything starts


async def test_a_learner_device_that_is_no_device_is_one_line(tmp_path: Path) -> None:
    """A name torch has no device for, and one GPU for every data-parallel rank (each takes cuda:LOCAL_RANK)."""
    learn = ("learn", "--env", "CartPole-v1", "--checkpoint-dir", str(tmp_path))
    named = rlgate(*learn, "--device", "gpu")
    ranks = rlgate(*learn, "--device", "cuda:0", "--num-learners", "2", "--port", "0")
    (code, stderr), (ranks_code, ranks_stderr) = await asyncio.gather(named, ranks)
    assert one_user_error(code, stderr).startswith("rlgate: --device: string should match pattern"), stderr
    assert one_user_error(ranks_code, ranks_stderr) == (
        "rlgate: --device cuda:0: data-parallel learners each train on cuda:LOCAL_RANK, one GPU per rank; "
        "pass --device cuda"
    )


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


@pytest.mark.slow
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
        ((f"{envs}:VectorReward", "{}", ROOT), "step() returned a reward array([1.]) (ndarray of shape (1,)), not a"),
        (("broken_syntax:Env", "{}", tmp_path), "env.id: cannot import 'broken_syntax': SyntaxError: invalid syntax"),
        (("broken_raise:Env", "{}", tmp_path), "env.id: cannot import 'broken_raise': RuntimeError: needs MUJOCO_KEY"),
    ]
    results = await asyncio.gather(
        *(rlgate("env", "--env", env, "--spec.env.kwargs", kwargs, *run, cwd=cwd) for (env, kwargs, cwd), _ in cases)
    )
    for ((env, _, _), expected), (code, stderr) in zip(cases, results, strict=True):
        assert expected in one_user_error(code, stderr), (env, stderr)


async def test_rlgate_env_refuses_a_space_the_wire_cannot_carry(server) -> None:
    args = ("env", "--server", f"127.0.0.1:{server.port}", "--env", "tests.support.odd_envs:SequenceObservations")
    line = one_user_error(*await rlgate(*args, "--no-progress"))
    assert line.startswith("rlgate: space Sequence(") and line.endswith("has no wire encoding"), line


@pytest.mark.slow
async def test_rlgate_env_names_the_multi_agent_env_and_what_is_wrong_with_it(server_factory) -> None:
    """A PettingZoo env that raises or breaks PettingZoo's contract: one line naming env and method, as a
    gymnasium env's (was "envs exited with 1" and a traceback); and an env of the other kind than the spec says."""
    pytest.importorskip("pettingzoo")
    envs = "tests.support.bad_agent_envs"
    spec = RunSpec.parse({"env": {"id": f"{envs}:ParallelSteps"}, "multi_agent": {}}, "test")
    server = await server_factory(spec=spec)
    run = ("--server", f"127.0.0.1:{server.port}", "--max-steps", "100", "--no-progress")
    multi = ("--spec.multi-agent", "{}")
    cases = {  # arguments -> what the line must say
        ("--env", f"{envs}:ParallelSteps", "--spec.env.kwargs", '{"fail_at": 5}', *multi): (
            f"env {envs}:ParallelSteps: step() raised RuntimeError: simulator crashed"
        ),
        ("--env", f"{envs}:TurnSteps", "--spec.env.kwargs", '{"fail_at": 5}', *multi): (
            f"env {envs}:TurnSteps: step() raised ValueError: illegal state"
        ),
        ("--env", f"{envs}:ParallelSteps", "--spec.env.kwargs", '{"nope": 1}', *multi): (
            f"env {envs}:ParallelSteps: __init__() raised TypeError: "
        ),
        ("--env", f"{envs}:VectorRewards", *multi): (
            f"env {envs}:VectorRewards: step() returned, for agent 'a0', a reward array([1.]) (ndarray of shape "
            "(1,)), not a number"
        ),
        ("--env", f"{envs}:FourValues", *multi): (
            f"env {envs}:FourValues: step() returned a tuple of 4, not PettingZoo's (observations, rewards, "
            "terminations, truncations, infos)"
        ),
        ("--env", f"{envs}:NoPossibleAgents", *multi): (
            f"env {envs}:NoPossibleAgents: NoPossibleAgents has no possible_agents: rlgate declares every agent"
        ),
        ("--env", "tests.support.bad_envs:Steps", *multi): (
            "env tests.support.bad_envs:Steps: a gymnasium env, not a PettingZoo ParallelEnv or AECEnv, but "
            "[multi_agent] is set"
        ),
        ("--env", f"{envs}:ParallelSteps"): (
            f"env {envs}:ParallelSteps: made a PettingZoo env (ParallelSteps), which runs with a [multi_agent] section"
        ),
        ("--env", f"{envs}:ParallelSteps", *multi, "--inference", "local"): (
            "inference local acts in single-agent runs: a multi-agent env (PettingZoo) needs the server to act"
        ),
    }
    results = await asyncio.gather(*(rlgate("env", *args, *run) for args in cases))
    for (args, expected), (code, stderr) in zip(cases.items(), results, strict=True):
        assert expected in one_user_error(code, stderr), (args, stderr)


@pytest.mark.parametrize("argv", [["serve", "--max-batch-size", "0"], ["learn", "--num-learners", "0"]])
def test_a_mistaken_flag_of_serve_or_learn_is_answered_before_torch_is_imported(argv: list[str]) -> None:
    """The settings are read first (server/command.py, learner/command.py): a typo costs no torch start-up."""
    probe = (
        "import sys\nfrom rlgate.cli.main import main\n"
        f"code = main({argv!r})\nprint(code, 'torch' in sys.modules, 'grpc' in sys.modules)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=60
    )
    assert ran.stdout.split() == ["2", "False", "False"], (ran.stdout, ran.stderr[-2000:])
    assert ran.stderr.startswith("rlgate: --"), ran.stderr
