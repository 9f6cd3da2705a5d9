"""`rlgate up`: the embedded default: learner, inference server and env clients as local processes.

It trains until the mean return of the last 20 episodes reaches `--stop-return` (exit 0) or
`--max-steps` env steps have been taken (exit 1), then shuts every process down (clients first, then
the server, which flushes its episodes, then the learner, which writes a final checkpoint). Ctrl-C
does the same. Each process logs to a file in the run directory.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlgate.learner.settings import LearnerSettings

POLL_S = 0.5
WINDOW = 20  # episodes in the mean return


class UpSettings(BaseSettings):
    """Knobs of `rlgate up`; the services' own settings keep their defaults unless set via RLGATE_*."""

    model_config = SettingsConfigDict(env_prefix="RLGATE_UP_", cli_kebab_case=True, cli_implicit_flags=True)

    env: str = Field("CartPole-v1", description="Gymnasium env id to train on.")
    seed: int = Field(0, description="Seed for the learner, the server's sampling and the envs.")
    stop_return: float | None = Field(
        None,
        description="Stop when the mean return of the last 20 episodes reaches this (default: the env's "
        "reward_threshold, 475 for CartPole-v1).",
    )
    max_steps: int = Field(100_000, ge=1, description="Stop (exit 1) after this many env steps.")
    num_clients: int = Field(2, ge=1, description="Env client processes.")
    envs_per_client: int = Field(4, ge=1, description="Sub-envs per client (one message carries all).")
    rollout_fragment_length: int = Field(32, ge=1, description="Server ships episode chunks of this many steps.")
    run_dir: Path = Field(Path("runs"), description="Logs and checkpoints go to run_dir/<env>-<time>.")


def run(settings: UpSettings) -> int:
    """Start everything, show progress, stop at the goal or the step budget; returns the exit code."""
    import gymnasium as gym

    spec = gym.spec(settings.env)
    stop_return = settings.stop_return if settings.stop_return is not None else spec.reward_threshold
    if stop_return is None:
        raise SystemExit(f"{settings.env} has no reward_threshold: pass --stop-return")
    run_dir = settings.run_dir / f"{settings.env}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    learner_port, learner_http, server_port, server_http = _free_ports(4)
    s = settings
    commands = {
        "learner": [
            "learn",
            "--env",
            s.env,
            "--port",
            learner_port,
            "--http-port",
            learner_http,
            "--checkpoint-dir",
            run_dir / "checkpoints",
            "--no-resume",
            "--seed",
            s.seed,
        ],
        "server": [
            "serve",
            "--learner",
            f"127.0.0.1:{learner_port}",
            "--port",
            server_port,
            "--http-port",
            server_http,
            "--spool-dir",
            run_dir / "spool",
            "--seed",
            s.seed,
            "--rollout-fragment-length",
            s.rollout_fragment_length,
            "--steps-per-version",  # sample at the learner's pace: on-policy data, no stale piles
            LearnerSettings().train_batch_size,
        ],
        "envs": [
            "env",
            "--server",
            f"127.0.0.1:{server_port}",
            "--env",
            s.env,
            "--num-clients",
            s.num_clients,
            "--envs-per-client",
            s.envs_per_client,
            "--seed",
            s.seed,
            "--no-progress",
        ],
    }
    processes: dict[str, subprocess.Popen] = {}
    started = time.monotonic()
    mean_return, steps, code = float("nan"), 0, 1
    with contextlib.ExitStack() as stack:
        stack.callback(_shut_down, processes)
        for name, args in commands.items():
            log = stack.enter_context(open(run_dir / f"{name}.log", "w"))
            processes[name] = subprocess.Popen(
                [sys.executable, "-m", "rlgate", *map(str, args)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        print(f"rlgate up: {s.env}, logs and checkpoints in {run_dir}", flush=True)
        try:
            while True:
                time.sleep(POLL_S)
                for name, process in processes.items():
                    if process.poll() is not None:
                        raise SystemExit(f"{name} exited with {process.returncode}: see {run_dir / (name + '.log')}")
                learner = _get_json(learner_http)
                server = _get_json(server_http)
                if learner is None or server is None:
                    continue
                steps = int(server.get("env_steps", 0))
                elapsed = time.monotonic() - started
                episodes = int(learner["episodes"])
                if learner["mean_return"] is not None:
                    mean_return = float(learner["mean_return"])
                print(
                    f"\renv steps {steps:>8}  {steps / elapsed:>7.0f} steps/s  mean return {mean_return:>6.1f} "
                    f"({episodes} episodes)  model v{learner['model_version']}",
                    end="",
                    flush=True,
                )
                if episodes >= WINDOW and mean_return >= stop_return:
                    code = 0
                    break
                if steps >= s.max_steps:
                    break
        except KeyboardInterrupt:
            for sig in (signal.SIGINT, signal.SIGTERM):  # one interrupt is enough: shut down in order
                signal.signal(sig, signal.SIG_IGN)
            print("\nCtrl-C: shutting down", flush=True)
            code = 130
    elapsed = time.monotonic() - started
    print(f"\ncheckpoint: {run_dir / 'checkpoints'}")
    if code == 0:
        print(f"reached return {mean_return:.1f} at {steps} env steps in {elapsed:.1f} s")
    else:
        print(f"stopped at return {mean_return:.1f} after {steps} env steps in {elapsed:.1f} s")
    return code


def _shut_down(processes: dict[str, subprocess.Popen]) -> None:
    """Stop in order (clients, server, learner), each with SIGTERM, then SIGKILL after a grace period."""
    for name in ("envs", "server", "learner"):
        process = processes.get(name)
        if process is None or process.poll() is not None:
            continue
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    settings = UpSettings(_cli_parse_args=argv, _cli_prog_name="rlgate up")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM shuts down like Ctrl-C
    return run(settings)
