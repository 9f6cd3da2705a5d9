"""`rlgate up`: the embedded default: learner, inference server and env clients as local processes.

It trains until the mean return of the last 20 episodes reaches `--stop-return` (exit 0) or
`--max-steps` env steps have been taken (exit 1), then shuts every process down (clients first, then
the server, which flushes its episodes, then the learner, which writes a final checkpoint). Ctrl-C, SIGTERM
and a hang-up do the same, whenever they come: `up` blocks them and polls for them, so none interrupts it
halfway through starting or stopping a child (no traceback, no child left behind); the processes start with
Ctrl-C and hang-ups ignored, so a terminal's, which reach the whole process group, stop only `up`, which then
stops them in that order; and they get SIGTERM if `up` dies without stopping them. The env clients
start once the server is ready, so a server that cannot start ends `up` with its own error. Each process logs
to a file in the run directory. Progress is a tqdm bar on a terminal, and a plain line every 10 s elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, ClassVar, Literal, NoReturn

import setproctitle
from pydantic import Field
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from tqdm import tqdm

from rlgate.cli.main import USAGE_ERROR
from rlgate.core.errors import UserError
from rlgate.learner.settings import LearnerDevice
from rlgate.service.fork_server import fork_server, stop_with_parent
from rlgate.service.process import process_started
from rlgate.service.settings import Directory, require_device, resolve_device
from rlgate.spec.imports import ImportPolicy, SpecError, split_path
from rlgate.spec.run import RunSpec
from rlgate.spec.settings import SpecSettings

POLL_S = 0.25
GRACE_S = 15.0  # each child's time to stop after SIGTERM (the learner writes a checkpoint) before SIGKILL
START_TIMEOUT_S = 300.0  # the server's time to become ready (a model, from the spec or the learner)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
# What the children import, for their fork server to import once: the commands, the learner and the server.
CHILD_MODULES = (
    "rlgate.cli.up",
    "rlgate.client.main",
    "rlgate.learner.command",
    "rlgate.learner.main",
    "rlgate.server.command",
    "rlgate.server.main",
)
MAX_FAILED_UPDATES = 3  # the learner's updates failing this many times in a row stop the run: nothing trains
PLAIN_EVERY_S = 10.0  # a progress line this often when the output is not a terminal
WINDOW = 20  # episodes in the mean return
# Goals of envs with a preset that registers no reward_threshold (`--stop-return` overrides).
GOALS = {
    "ALE/Pong-v5": 20.0,  # of 21 points: where RLlib's Pong examples stop
    "MiniGrid-Empty-5x5-v0": 0.9,  # the shortest way (5 steps) returns 1 - 0.9 * 5 / 100 = 0.955; 0.9 is 11 steps
}


class UpSettings(SpecSettings):
    """Knobs of `rlgate up`; what the run is comes from the run spec (--config, --spec.*, --env, --seed)."""

    model_config = SettingsConfigDict(
        env_prefix="RLGATE_UP_",
        env_nested_delimiter="__",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=False,  # a bad flag raises; the command line prints it as one line (cli/main.py)
    )
    SHORTHANDS: ClassVar[dict[str, tuple[str, ...]]] = {
        **SpecSettings.SHORTHANDS,
        "envs_per_client": ("env", "num_envs"),
    }
    # Without --config: CartPole, 8 sub-envs, seed 0.
    DEFAULT_SPEC: ClassVar[dict[str, Any]] = {"env": {"id": "CartPole-v1", "num_envs": 8}, "seed": 0}

    envs_per_client: int | None = Field(None, ge=1, description="Shorthand for --spec.env.num-envs.")
    stop_return: float | None = Field(
        None,
        allow_inf_nan=False,  # a NaN goal is never reached and an infinite one never met: a typo, not a run
        description="Stop when the mean return of the last 20 episodes reaches this (default: the env's "
        "reward_threshold, 475 for CartPole-v1; 20 for ALE/Pong-v5, 0.9 for MiniGrid-Empty-5x5-v0).",
    )
    max_steps: int = Field(
        100_000,
        ge=1,
        description="Stop after this many env steps: exit 1 short of the goal; exit 0 in a run with no goal (an env "
        "without reward_threshold and no --stop-return, where --max-steps given is the run's length).",
    )
    num_clients: int = Field(
        1,
        ge=1,
        description="Env client processes, each stepping the spec's env.num_envs sub-envs. One is fastest where "
        "the learner, the server and the clients share a few cores: fewer, larger messages.",
    )
    run_dir: Directory = Field(
        Path("runs"), description="Logs, the run spec and checkpoints go to run_dir/<env>-<time>."
    )
    device: LearnerDevice = "cpu"  # the learner's (`rlgate learn --device`); the server acts on the CPU
    inference: Literal["server", "local"] = Field(
        "server",
        description="Where the policy acts: on the server, or in each env client with the weights the server relays "
        "(rlgate env --inference local; single-agent runs), which sends the server its episodes.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """RLGATE_SPEC__* too, as every command reads them, under `up`'s own RLGATE_UP_SPEC__*."""
        return init_settings, env_settings, SpecVariables(settings_cls), dotenv_settings, file_secret_settings


class SpecVariables(EnvSettingsSource):
    """The run spec's variables of every command, `RLGATE_SPEC__ALGORITHM__LR`, for a command of another prefix."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls, env_prefix="RLGATE_")

    def __call__(self) -> dict[str, Any]:
        return {key: value for key, value in super().__call__().items() if key == "spec"}


def run(settings: UpSettings) -> int:
    """Start everything, show progress, stop at the goal or the step budget; returns the exit code.

    A user error that ends the run removes its run directory (always its own) again when it holds nothing worth
    keeping (no checkpoint, no spooled episodes): a typo leaves no empty runs behind."""
    if settings.device != "cpu":  # before any process starts (torch's import: only for a device to check)
        require_device(resolve_device(settings.device))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", settings.spec.env.id)
    run_dir, created = _new_run_directory(settings.run_dir, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        return _run(settings, run_dir)
    except UserError:
        if not _worth_keeping(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
            for parent in created[1:]:  # the ancestors made for it, deepest first, while empty
                with contextlib.suppress(OSError):
                    parent.rmdir()
        raise


def _new_run_directory(parent: Path, name: str) -> tuple[Path, list[Path]]:
    """A new directory of this run's own: parent/name, or name-2, name-3, ... where another `up` started in the
    same second (two runs never share one, and one that fails removes only its own). Returns it and the
    directories created for it, deepest first. A parent through a file, or one that cannot be made, is a
    UserError naming --run-dir."""
    missing = [p for p in (parent, *parent.parents) if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            path = parent / (name if n == 1 else f"{name}-{n}")
            with contextlib.suppress(FileExistsError):
                path.mkdir()
                return path, [path, *missing]
    except OSError as exc:
        raise UserError(f"--run-dir {parent / name}: cannot create it: {exc.strerror}") from None
    raise UserError(f"--run-dir {parent}: 999 runs named {name} already")


def _worth_keeping(run_dir: Path) -> bool:
    """Whether a run directory holds what a run produced: a checkpoint or spooled episodes (logs alone are not)."""
    return any(p.is_file() for sub in ("checkpoints", "spool") for p in (run_dir / sub).rglob("*"))


def _run(settings: UpSettings, run_dir: Path) -> int:
    """The run itself, in `run_dir`: processes, progress, shutdown."""
    s, spec = settings, settings.spec
    spec_file = run_dir / "spec.json"  # the one run spec every process reads (the server gets it from the learner)
    spec_file.write_text(spec.model_dump_json(indent=2))
    learner_port, learner_http, server_port, server_http = _free_ports(4)
    commands = {
        "learner": [
            *("learn", "--config", spec_file, "--port", learner_port, "--http-port", learner_http),
            # spec.json is whole; the preset `up` started from, not the env id's, says so in the child's log too.
            *("--preset", s.preset),
            *("--checkpoint-dir", run_dir / "checkpoints", "--no-resume"),
            *("--torch-threads", 1),  # it shares the cores with the server and clients (LearnerSettings)
            *("--device", s.device),
            *("--log-dir", run_dir),  # TensorBoard event files and progress.csv: `tensorboard --logdir runs`
        ],
        "server": [
            *("serve", "--learner", f"127.0.0.1:{learner_port}", "--port", server_port, "--http-port", server_http),
            *("--spool-dir", run_dir / "spool", "--seed", spec.seed if spec.seed is not None else 0),
            *("--allow-import", json.dumps(spec.policy_modules())),  # the operator of `up` chose this spec
            # The learner's spec: seeded, its version 0 is served at once instead of after the learner's start-up.
            *(("--config", spec_file) if spec.seed is not None else ()),
            *(("--allow-non-finite-obs",) if spec.env.allow_nonfinite_obs else ()),
        ],
        "envs": [
            *("env", "--server", f"127.0.0.1:{server_port}", "--config", spec_file, "--preset", s.preset),
            *("--num-clients", s.num_clients, "--no-progress", "--inference", s.inference),
            *(("--spool-dir", run_dir / "spool") if s.inference == "local" else ()),
        ],
    }
    children = Children(run_dir)
    started = process_started()  # "in T s" counts the command's own start-up too
    mean_return, steps, code = float("nan"), 0, 1
    with contextlib.ExitStack() as stack:
        stack.callback(children.shut_down)
        for name in ("learner", "server"):
            children.start(name, commands[name])
        # Only now: gymnasium's import would delay every process (a mistake here stops them again).
        stop_return = (
            s.stop_return if s.stop_return is not None else _reward_threshold(spec, ImportPolicy(spec.modules()))
        )
        # No goal: the step budget is the run, when the user gave one (a zero-sum game's return is always 0).
        no_goal = f"no --stop-return, and {spec.env.id} has no reward_threshold"
        if stop_return is None and "max_steps" not in s.model_fields_set:
            raise SpecError(
                f"{spec.env.id} has no reward_threshold: pass --stop-return R to stop at a mean return of R, "
                "or --max-steps N to train N env steps with no goal"
            )
        print(f"rlgate up: {spec.env.id}, logs, run spec and checkpoints in {run_dir}", flush=True)
        print(f"pages: learner http://127.0.0.1:{learner_http}/, server http://127.0.0.1:{server_http}/", flush=True)
        print(s.preset_line(), flush=True)
        children.announce = True
        # The env clients connect once the server is ready: a server that fails to start says why in its own
        # words (its log), not as the clients' timeout connecting to it.
        stopped = _until_ready(children, server_http)
        if stopped is None:
            children.start("envs", commands["envs"])
            progress = stack.enter_context(Progress(s.max_steps))
            while (stopped := _stop_signal(POLL_S)) is None:
                children.check()
                learner = _get_json(learner_http)
                server = _get_json(server_http)
                if learner is None or server is None or "episodes" not in learner:
                    continue  # not answering yet, or (a port taken in between) not our learner: check() will tell
                if learner.get("failed_updates_in_a_row", 0) >= MAX_FAILED_UPDATES:
                    raise SystemExit(
                        f"rlgate: the learner's last {MAX_FAILED_UPDATES} updates failed, nothing trains: "
                        f"see {run_dir / 'learner.log'}"
                    )
                steps = int(server.get("env_steps", 0)) + int(server["local_clients"]["env_steps"])
                elapsed = time.monotonic() - started
                episodes = int(learner["episodes"])
                if learner["mean_return"] is not None:
                    mean_return = float(learner["mean_return"])
                by_module = "".join(f", {m} {r:.2f}" for m, r in learner.get("module_mean_returns", {}).items())
                returns = f"mean return {mean_return:.1f}{by_module} ({episodes} episodes)" if episodes else None
                progress.show(steps, elapsed, f"{returns or 'no episode ended yet'}, model v{learner['model_version']}")
                if stop_return is not None and episodes >= WINDOW and mean_return >= stop_return:
                    code = 0
                    break
                if steps >= s.max_steps:
                    code = 0 if stop_return is None else 1  # without a goal, the budget is the run's end
                    break
            progress.close()
        elapsed = time.monotonic() - started  # to the goal, the budget or the signal; shutting down is not counted
        if stopped is not None:
            print(f"{_signal_name(stopped)}: shutting down", flush=True)
            code = 128 + stopped
    print(f"checkpoint: {run_dir / 'checkpoints'}")
    if code == 0 and stop_return is None:
        at = "" if math.isnan(mean_return) else f" at return {mean_return:.1f}"
        print(f"ran to --max-steps{at}: {steps} env steps in {elapsed:.1f} s ({no_goal})")
    elif code == 0:
        print(f"reached return {mean_return:.1f} at {steps} env steps in {elapsed:.1f} s")
    elif math.isnan(mean_return):
        print(f"stopped after {steps} env steps in {elapsed:.1f} s, before any episode ended")
    else:
        print(f"stopped at return {mean_return:.1f} after {steps} env steps in {elapsed:.1f} s")
    return code


class Children:
    """`up`'s child processes (learner, server, env clients): forked from one fork server that imported what they
    import (torch and gRPC: ~2.5 CPU-s a process) once, started so that stopping them is `up`'s alone, checked for
    an early exit, stopped in order."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.processes: dict[str, BaseProcess] = {}
        self.announce = False  # say which child it stops (once the run was announced, not after a user error)
        # Started by the first child's start: `up` blocks the stop signals then, and the children inherit that.
        self._context = fork_server(CHILD_MODULES)

    def start(self, name: str, args: list[Any]) -> None:
        """Start `rlgate ARGS` (`_child`), logging to name.log."""
        argv = [str(arg) for arg in args]
        log = self.run_dir / f"{name}.log"
        process = self._context.Process(target=_child, args=(argv, log, _child_environment()), name=f"rlgate-{name}")
        process.start()
        self.processes[name] = process

    def check(self) -> None:
        """End `up` with the first child's own error if one has exited (learner, then server, then env clients)."""
        for name, process in self.processes.items():
            if process.exitcode is not None:
                _child_failed(name, process.exitcode, self.run_dir / f"{name}.log")

    def shut_down(self) -> None:
        """Stop in order (clients, server, learner), each with SIGTERM, then SIGKILL after a grace period. Stop
        signals stay blocked meanwhile: one more Ctrl-C changes nothing, and every wait is bounded."""
        for name, what in (("envs", "env clients"), ("server", "server"), ("learner", "learner")):
            process = self.processes.get(name)
            if process is None or process.exitcode is not None:
                continue
            if self.announce:
                with contextlib.suppress(OSError):  # a closed stdout (`up | head`) must not stop the stopping
                    print(f"stopping the {what}", flush=True)
            process.terminate()
            process.join(GRACE_S)
            if process.exitcode is None:
                process.kill()
                process.join()


def _child(argv: list[str], log: Path, environment: dict[str, str]) -> None:
    """A child's body, in the process forked for it: `rlgate ARGV`, as `python -m rlgate ARGV` would run it, with
    its output to `log`, `environment` as its environment and that command line in ps. The stop signals `up`
    blocks are delivered again; Ctrl-C and a hang-up, which a terminal sends to the whole process group, are
    ignored, so `up` alone acts on them and stops the children in order; and it gets SIGTERM when `up` is gone,
    however `up` ended (even SIGKILL)."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # first: one coming once unblocked must find it ignored
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    stop_with_parent()
    with open(log, "w") as file:  # stdin is /dev/null already (multiprocessing's)
        os.dup2(file.fileno(), sys.stdout.fileno())
        os.dup2(file.fileno(), sys.stderr.fileno())
    sys.argv = ["rlgate", *argv]
    setproctitle.setproctitle(shlex.join(sys.argv))  # first: it finds the command line's memory from the environment's
    os.environ.clear()
    os.environ.update(environment)
    from rlgate.cli.main import main

    sys.exit(main(argv))


def _stop_signal(timeout: float) -> int | None:
    """A stop signal (SIGINT, SIGTERM, SIGHUP) that came, waiting up to `timeout` s for one; None if none did.

    `up` blocks them from its start (`main`), so one never interrupts it anywhere, and is taken only here."""
    info = signal.sigtimedwait(STOP_SIGNALS, timeout)
    return None if info is None else info.si_signo


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _until_ready(children: Children, http_port: int) -> int | None:
    """Wait until the server is ready (/readyz: it holds a model and can answer steps), a child exits (its own
    error ends `up`), a stop signal comes (returned) or START_TIMEOUT_S pass (an error naming why it is not)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    reason = "no answer on its HTTP port"
    while (stopped := _stop_signal(POLL_S)) is None:
        children.check()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2):
                return None
        except urllib.error.HTTPError as exc:  # 503: it says why
            with contextlib.suppress(OSError, ValueError):
                reason = json.loads(exc.read()).get("reason", reason)
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(
                f"rlgate: the server was not ready after {START_TIMEOUT_S:.0f} s ({reason}): "
                f"see {children.run_dir / 'server.log'}"
            )
    return stopped


class Progress(contextlib.AbstractContextManager):
    """The progress line: a tqdm bar on a terminal; elsewhere (a pipe, a log file) a plain line now and then,
    so no carriage-return runs end up in a file."""

    def __init__(self, total: int) -> None:
        self._bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stdout) if sys.stdout.isatty() else None
        self._printed = -PLAIN_EVERY_S

    def show(self, steps: int, elapsed: float, text: str) -> None:
        if self._bar is not None:
            self._bar.update(steps - self._bar.n)
            self._bar.set_postfix_str(text)
        elif elapsed - self._printed >= PLAIN_EVERY_S:
            print(f"env steps {steps}, {steps / elapsed:.0f} steps/s, {text}", flush=True)
            self._printed = elapsed

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_failed(name: str, code: int, log: Path) -> NoReturn:
    """End `up` with the child's own `rlgate: ...` line (else its log's last line); exit 2 for a child's user
    error (its exit 2), so a mistake in the spec reads and ends as if `up` had found it. Any other failure
    also says where the child's log is (the run directory is kept then)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    said = [line.removeprefix("rlgate: ") for line in lines if line.startswith("rlgate: ")]
    reason = said[-1] if said else lines[-1].strip() if lines else "no output"
    if code == USAGE_ERROR:  # the child's own line says it all; its log may go with an empty run directory
        raise UserError(f"{name}: {reason}")
    raise SystemExit(f"rlgate: {name} exited with {code}: {reason} (log: {log})")


def _reward_threshold(spec: RunSpec, imports: ImportPolicy) -> float | None:
    """The registered env's reward_threshold, else rlgate's goal for it (GOALS); None for an env class or
    factory, or an env with neither."""
    import gymnasium as gym

    from rlgate.spec.env import register_env_id

    env_id = spec.env.id
    if ":" in env_id:
        module, env_id = split_path(env_id)
        imports.import_module(module, "env.id")  # first: a module that does not import is the real problem
        if env_id.isidentifier():  # an env class or factory: not registered
            return None
    register_env_id(env_id)
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error as exc:
        raise SpecError(f"env.id: {exc}") from exc
    return GOALS.get(env_id) if threshold is None else threshold


def _child_environment() -> dict[str, str]:
    """This environment less the variables that set a run spec (RLGATE_SPEC__*, RLGATE_SEED, ...): `up` applied
    them to spec.json, every child's one spec; a child reading them over it could run another spec, unseen."""
    spec_variables = {f"RLGATE_{name.upper()}" for name in (*SpecSettings.model_fields, *UpSettings.SHORTHANDS)}
    return {
        key: value
        for key, value in os.environ.items()
        if key.upper() not in spec_variables and not key.upper().startswith("RLGATE_SPEC__")
    }


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _get_json(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
            return json.loads(response.read())
    except OSError:
        return None


def main(argv: list[str]) -> int:
    # Ctrl-C, SIGTERM and a hang-up are taken only where `up` polls for them (`_stop_signal`): wherever one comes,
    # it starts the orderly shutdown, never a traceback halfway through starting or stopping a child.
    # First multiprocessing's resource tracker, which the children's fork server needs: starting it unblocks
    # SIGINT and SIGTERM (in multiprocessing's own code), so it must run before they are blocked, not after.
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    settings = UpSettings(_cli_parse_args=argv, _cli_prog_name="rlgate up")
    if (stopped := _stop_signal(0)) is not None:
        print(f"{_signal_name(stopped)}: nothing started")
        return 128 + stopped
    return run(settings)
