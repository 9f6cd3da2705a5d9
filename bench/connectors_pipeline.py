"""Micro benchmark of the connector pipelines on the server's batched fast path.

Per env step cost of env-to-module + module-to-env with the default pieces plus a MeanStdFilter, on B
running CartPole episodes (list mode, CPU), called as the inference server calls them (see
`connectors/__init__.py`). The forward pass is left out: module-to-env gets the module's outputs
(ACTION_DIST_INPUTS) computed once. Stepping the envs and appending to the episodes is not
timed. Run: `.venv/bin/python -m rlgate.bench.connectors_pipeline`.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.builders import build_env_to_module_pipeline, build_module_to_env_pipeline
from rlgate.connectors.env_to_module import MeanStdFilter
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.models import build_module


class _CartPoles:
    """B CartPole envs, each with its running episode (a finished one is replaced by a fresh one)."""

    def __init__(self, batch_size: int, seed: int = 0) -> None:
        self.envs = [gym.make("CartPole-v1") for _ in range(batch_size)]
        self.episodes = [self._reset(i, seed + i) for i in range(batch_size)]

    def _reset(self, i: int, seed: int | None = None) -> SingleAgentEpisode:
        env = self.envs[i]
        episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
        episode.add_env_reset(env.reset(seed=seed)[0])
        return episode

    def step(self, to_env: dict) -> np.ndarray:
        """Step every env with its row of `to_env`, append to the episodes; return the new latest obs."""
        actions, actions_for_env = to_env.pop(Columns.ACTIONS), to_env.pop(Columns.ACTIONS_FOR_ENV)
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions_for_env[i]))
            outputs = {key: value[i] for key, value in to_env.items()}
            self.episodes[i].add_env_step(
                obs, actions[i], reward, terminated=terminated, truncated=truncated, extra_model_outputs=outputs
            )
            if terminated or truncated:
                self.episodes[i] = self._reset(i)
        return np.stack([episode.get_observations(-1) for episode in self.episodes])


def measure(batch_size: int, steps: int = 200, warmup: int = 20) -> dict[str, Any]:
    """Median microseconds per call of both pipelines, their sum per env step, and the mean per piece.

    Medians, because a shared CPU host now and then stalls torch's thread pool for milliseconds.
    """
    cartpoles = _CartPoles(batch_size)
    env = cartpoles.envs[0]
    env_to_module = build_env_to_module_pipeline(
        env.observation_space, env.action_space, env_to_module_connector=lambda obs, act: MeanStdFilter()
    )
    module_to_env = build_module_to_env_pipeline(env.observation_space, env.action_space)
    module = build_module(env_to_module.observation_space, env.action_space)
    obs = np.stack([episode.get_observations(-1) for episode in cartpoles.episodes])
    with torch.inference_mode():
        forward_out = module.forward_exploration({Columns.OBS: torch.from_numpy(obs)})

    timed: dict[str, list[float]] = {"env_to_module": [], "module_to_env": []}
    pieces: dict[str, float] = {}
    for step in range(warmup + steps):
        if step == warmup:
            timed = {name: [] for name in timed}
            pieces = {}
        shared_data: dict = {}
        with torch.inference_mode():
            start = time.perf_counter()
            env_to_module(
                rl_module=module,
                batch={Columns.OBS: obs},
                episodes=cartpoles.episodes,
                explore=True,
                shared_data=shared_data,
                metrics=pieces,
            )
            middle = time.perf_counter()
            to_env = module_to_env(
                rl_module=module,
                batch=dict(forward_out),
                episodes=cartpoles.episodes,
                explore=True,
                shared_data=shared_data,
                metrics=pieces,
            )
            end = time.perf_counter()
        timed["env_to_module"].append(middle - start)
        timed["module_to_env"].append(end - middle)
        obs = cartpoles.step(to_env)

    per_call_us = {name: statistics.median(seconds) * 1e6 for name, seconds in timed.items()}
    return {
        "us_per_env_step": round(sum(per_call_us.values()) / batch_size, 2),
        "env_to_module_us_per_call": round(per_call_us["env_to_module"], 1),
        "module_to_env_us_per_call": round(per_call_us["module_to_env"], 1),
        "mean_us_per_call_by_piece": {name: round(s / steps * 1e6, 1) for name, s in pieces.items()},
    }


def run(batch_sizes: tuple[int, ...] = (64, 256), steps: int = 200) -> dict[str, dict]:
    """The fast-path cost per env step at each batch size (RLlib 2.60: 89 us at B=64, 44 us at B=256).

    Runs with one torch intra-op thread (restored after): on tensors this small a thread pool only adds
    wake-ups, and on a busy host a stalled pool thread costs milliseconds per op.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {f"B={b}": measure(b, steps) for b in batch_sizes}
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
