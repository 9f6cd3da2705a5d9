"""The in-process floor: the server's own hot path with no network, to compare rlgate to.

One process steps gymnasium's vectorised CartPole-v1 and, per step, does what the server does for the
same env steps: the server's `Session` appends them to their episodes, the server's `ActingCore` runs the
env-to-module pipeline, the forward pass and the module-to-env pipeline, and `Session.record` keeps the
outputs. No gRPC, no codec, no event loop, no batcher. The envs are split into vector envs of at most
`max_batch_size` sub-envs (the server's batch limit), stepped in turn.
Run: `python -m rlgate.bench.inprocess --envs N [N ...] --window-s S`; prints one JSON line per measuring window:
`{"envs": N, "steps": ..., "seconds": ..., "latency_us": [duration of every step of all sub-envs]}`.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np

from rlgate.bench.cartpole import make_env
from rlgate.core.columns import Columns
from rlgate.episodes.session import Session, SessionSpec
from rlgate.policy.acting import ActingCore
from rlgate.spec.run import RunSpec


class InProcess:
    """Vector envs of at most `max_batch_size` sub-envs, each with its session, sharing one acting core."""

    def __init__(self, envs: int, max_batch_size: int) -> None:
        sizes = [min(max_batch_size, envs - start) for start in range(0, envs, max_batch_size)]
        self.envs = [make_env(size, real=True) for size in sizes]
        assert isinstance(self.envs[0], gym.vector.VectorEnv)  # real=True
        observation_space, action_space = self.envs[0].single_observation_space, self.envs[0].single_action_space
        self.core = ActingCore.build(RunSpec(), observation_space, action_space, seed=0)
        self.sessions = [
            Session(
                SessionSpec("bench", observation_space, action_space, size, explore=True),
                rollout_fragment_length=200,
                lookback=1,
            )
            for size in sizes
        ]
        # Per vector env: what its last step returned (the first message's rewards and flags are ignored).
        self._last = [
            (env.reset(seed=i)[0], np.zeros(env.num_envs), np.zeros(env.num_envs, bool), np.zeros(env.num_envs, bool))
            for i, env in enumerate(self.envs)
        ]

    def step(self) -> int:
        """One env step of every sub-env; returns the transitions appended (reset observations are not)."""
        steps = 0
        for i, (env, session) in enumerate(zip(self.envs, self.sessions, strict=True)):
            obs, rewards, terminateds, truncateds = self._last[i]
            episodes, appended = session.observe(obs, rewards, terminateds, truncateds, None)
            outputs = self.core.act(episodes, True, obs)
            session.record(outputs)
            obs, rewards, terminateds, truncateds, _ = env.step(outputs[Columns.ACTIONS_FOR_ENV])
            self._last[i] = (obs, rewards, terminateds, truncateds)
            steps += appended
        return steps


def measure(floor: InProcess, window_s: float) -> dict[str, float | list[int]]:
    """Env steps and seconds of one window, and the duration of every step (all sub-envs once) in it."""
    steps, durations = 0, []
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + window_s:
        steps += floor.step()
        durations.append(time.perf_counter() - now)
    return {"steps": steps, "seconds": time.perf_counter() - started, "latency_us": [round(d * 1e6) for d in durations]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.inprocess", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", required=True, help="sub-envs in all, one run per value")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for envs in args.envs:
        floor = InProcess(envs, args.max_batch_size)
        measure(floor, args.warmup_s)
        for _ in range(args.repeats):
            print(json.dumps({"envs": envs, **measure(floor, args.window_s)}), flush=True)


if __name__ == "__main__":
    main()
