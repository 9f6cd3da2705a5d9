"""Data-parallel learners: env steps trained per second with 1 and N ranks on the same chunks, and what the
group's collectives cost per update.

CartPole-v1 chunks are sampled once (a fresh policy acting through a server Session, as a server ships them);
then each configuration runs `--updates` PPO updates on copies of them, after `--warmup` untimed ones: a Trainer in
this process (rank 0, with one torch thread per rank), and for N > 1 ranks, N - 1 `rlgate learn` followers started
as torchrun would start them. Printed per configuration: the median update's seconds, env steps trained per
second, and its seconds in the scatter of the batch, the gradients' all-reduces and the weight digest check; then
the median all-reduce of the gradients' size between two ranks that do nothing else (its own cost). The
spec is CartPole's preset with the flags' batch, minibatch, epochs and hidden layers. Run:
`python -m rlgate.bench.learners [--ranks 1 2] [--train-batch-size 256] [--minibatch-size 256] [--hiddens 64 64]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import chunk_message, episode_from_proto
from rlgate.episodes.session import Session, SessionSpec
from rlgate.learner.data_parallel import Group, Rendezvous
from rlgate.learner.trainer import Trainer
from rlgate.policy.acting import ActingCore
from rlgate.service.process import bind
from rlgate.spec.algorithm import PPOConfig
from rlgate.spec.build import build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.presets import preset
from rlgate.spec.run import RunSpec

ENV_ID, NUM_ENVS = "CartPole-v1", 8
TIMED = ("update_s", "scatter_s", "allreduce_s", "check_s")


def sample(spec: RunSpec, steps: int) -> list[SingleAgentEpisode]:
    """At least `steps` env steps of CartPole chunks, as a server ships them (cut every rollout_fragment_length)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(NUM_ENVS)])
    session_spec = SessionSpec("bench", envs.single_observation_space, envs.single_action_space, NUM_ENVS, True)
    core = ActingCore.build(spec, session_spec.observation_space, session_spec.action_space, seed=0)
    session = Session(session_spec, rollout_fragment_length=spec.sampling.rollout_fragment_length, lookback=1)
    obs, _ = envs.reset(seed=0)
    rewards, dones = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, bool)
    chunks: list[SingleAgentEpisode] = []
    while sum(map(len, chunks)) < steps:
        episodes, _ = session.observe(obs, rewards, dones, np.zeros(NUM_ENVS, bool), None)
        outputs = core.act(episodes, True, obs)
        for chunk in session.record(outputs):
            chunks.append(episode_from_proto(chunk_message(chunk.columns), chunk.observation_space, chunk.action_space))
        obs, rewards, terminated, truncated, _ = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
        dones = terminated | truncated
    envs.close()
    return chunks


def measure(spec: RunSpec, ranks: int, chunks: list[SingleAgentEpisode], updates: int, warmup: int) -> dict[str, Any]:
    """Median figures of `updates` updates on these chunks by `ranks` data-parallel learners."""
    observation_space, action_space = gym.make(ENV_ID).observation_space, gym.spaces.Discrete(2)
    module = build_rl_module(spec, observation_space, action_space, ImportPolicy())
    pipeline = build_learner_connector(spec, observation_space, action_space, ImportPolicy())
    assert isinstance(spec.algorithm, PPOConfig)  # data-parallel learners train PPO
    trainer = Trainer(module, pipeline, spec.algorithm, max_staleness=10**9, seed=0)
    followers, group = [], None
    if ranks > 1:
        with bind("127.0.0.1", 0, "rendezvous") as sock:
            rendezvous = Rendezvous(0, ranks, "127.0.0.1", sock.getsockname()[1])
        command = [sys.executable, "-m", "rlgate", "learn", "--torch-threads", "1"]
        followers = [
            subprocess.Popen(command, env={**os.environ, **rendezvous.env(rank)}, stdin=subprocess.DEVNULL)
            for rank in range(1, ranks)
        ]
        group = Group(rendezvous, 120)
        group.send_start(spec, observation_space, action_space)
        trainer.join(group)
    rows: dict[str, list[float]] = {key: [] for key in TIMED}
    steps = 0
    try:
        for i in range(warmup + updates):
            episodes = copy.deepcopy(chunks)
            started = time.perf_counter()
            stats = trainer.update(episodes)
            seconds = time.perf_counter() - started
            if i >= warmup:
                steps = stats["env_steps"]
                for key in TIMED:
                    rows[key].append(seconds if key == "update_s" else stats.get(key, 0.0))
        if group is not None:
            group.stop()
    finally:
        for follower in followers:
            follower.wait(60)
        if group is not None:
            group.close()
    median = {key: statistics.median(values) for key, values in rows.items()}
    return {"ranks": ranks, "env_steps": steps, "env_steps_per_s": steps / median["update_s"], **median}


def allreduce_floor(numel: int, calls: int, rank: int = 0, port: int = 0) -> float:
    """Median seconds of one all-reduce of `numel` float32 between two ranks doing nothing else (rank 0 starts
    rank 1 as `--allreduce-rank 1`): the all-reduce's own cost, without the wait for a slower rank that an
    update's `allreduce_s` also holds."""
    follower = None
    if rank == 0:
        with bind("127.0.0.1", 0, "rendezvous") as sock:
            port = sock.getsockname()[1]
        command = [sys.executable, "-m", "rlgate.bench.learners", "--allreduce-rank", "1", "--port", str(port)]
        command += ["--numel", str(numel), "--calls", str(calls)]
        follower = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    group = Group(Rendezvous(rank, 2, "127.0.0.1", port), 120)
    flat, seconds = torch.ones(numel), []
    for _ in range(calls):
        started = time.perf_counter()
        torch.distributed.all_reduce(flat)
        seconds.append(time.perf_counter() - started)
    group.close()
    if follower is not None:
        follower.wait(60)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.learners", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="learner ranks, one run per value")
    parser.add_argument("--train-batch-size", type=int, default=256)
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--num-epochs", type=int, default=20)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64], help="the MLP's hidden layers")
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of rank 0 (each follower has one)")
    parser.add_argument("--allreduce-rank", type=int, default=0, help=argparse.SUPPRESS)  # allreduce_floor's rank 1
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--numel", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=200, help="all-reduces timed alone, of the gradients' size")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.allreduce_rank:
        allreduce_floor(args.numel, args.calls, args.allreduce_rank, args.port)
        return
    algorithm = {"train_batch_size": args.train_batch_size, "minibatch_size": args.minibatch_size}
    algorithm |= {"num_epochs": args.num_epochs}
    data = preset(ENV_ID, "PPO")
    data["algorithm"] |= algorithm
    data["model"] = {"config": {"fcnet_hiddens": args.hiddens}}
    spec = RunSpec.model_validate({**data, "seed": 0})
    chunks = sample(spec, args.train_batch_size)
    for ranks in args.ranks:
        result = measure(spec, ranks, chunks, args.updates, args.warmup)
        print(json.dumps({**result, **algorithm, "hiddens": args.hiddens, "threads": args.threads}), flush=True)
    space = gym.make(ENV_ID).observation_space
    numel = sum(p.numel() for p in build_rl_module(spec, space, gym.spaces.Discrete(2), ImportPolicy()).parameters())
    alone = allreduce_floor(numel + 7, args.calls)  # Group.average's buffer: the gradients, 6 loss parts and a count
    print(json.dumps({"allreduce_alone_s": alone, "floats": numel + 7, "calls": args.calls}), flush=True)


if __name__ == "__main__":
    main()
