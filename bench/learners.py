"""Data-parallel learners: env steps trained per second with 1 and N ranks on the same chunks, and what the
group's collectives cost per update.

Chunks are sampled once (a fresh policy acting through a server Session, as a server ships them: CartPole-v1 for PPO
and DQN, Pendulum-v1 for SAC); then each configuration runs `--updates` timed calls of the trainer's update after
`--warmup` untimed ones: a trainer in this process (rank 0, with one torch thread per rank), and for N > 1 ranks,
N - 1 `rlgate learn` followers started as torchrun would start them. PPO: each call is one update on copies of the
same chunks, cut to `train_batch_size` env steps as the learner's intake cuts them. DQN and SAC: each call adds
fresh chunks to the replay buffer, `broadcast_interval` updates' worth at the preset's training intensity, and runs
those updates (one version), each on a train batch rank 0 samples and scatters. Printed per configuration: the
median call's seconds, env steps trained per second (DQN, SAC: env steps whose updates are done, at the training
intensity), and the collectives' seconds (PPO: per update; DQN, SAC: the scatter, all-reduces and gather per update,
the digest check per call); then the median all-reduce of the gradients' size between two ranks that do nothing else
(its own cost). The spec is the env's preset for the algorithm, with the flags' hidden layers if given (PPO: batch,
minibatch, epochs too). Run: `python -m rlgate.bench.learners [--algo PPO] [--ranks 1 2] [--train-batch-size 256]
[--minibatch-size 256] [--hiddens 64 64]`.
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
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.trainer import Trainer
from rlgate.policy.acting import ActingCore
from rlgate.service.process import bind
from rlgate.spec.algorithm import PPOConfig
from rlgate.spec.build import build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.presets import preset
from rlgate.spec.run import RunSpec

NUM_ENVS = 8
ENVS = {"PPO": "CartPole-v1", "DQN": "CartPole-v1", "SAC": "Pendulum-v1"}  # each has the algorithm's preset
TIMED = ("update_s", "scatter_s", "allreduce_s", "gather_s", "check_s")


def sample(spec: RunSpec, steps: int) -> list[SingleAgentEpisode]:
    """At least `steps` env steps of the spec's env's chunks, as a server ships them (cut every
    rollout_fragment_length)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(spec.env.id) for _ in range(NUM_ENVS)])
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


def calls(spec: RunSpec, chunks: list[SingleAgentEpisode], count: int) -> list[list[SingleAgentEpisode]]:
    """Each call's chunks: PPO's, copies of their first `train_batch_size` env steps; DQN's and SAC's, the next
    `broadcast_interval` updates' env steps of them (fresh steps for the replay buffer)."""
    if isinstance(spec.algorithm, PPOConfig):
        batch = first_steps(chunks, spec.algorithm.train_batch_size)
        return [copy.deepcopy(batch) for _ in range(count)]
    per_call = spec.algorithm.steps_per_update() * spec.algorithm.broadcast_interval
    groups: list[list[SingleAgentEpisode]] = [[]]
    for chunk in chunks:
        if sum(map(len, groups[-1])) >= per_call:
            groups.append([])
        groups[-1].append(chunk)
    if len(groups) < count:
        raise ValueError(f"{len(groups)} calls' chunks sampled for {count} calls")
    return groups[:count]


def first_steps(chunks: list[SingleAgentEpisode], steps: int) -> list[SingleAgentEpisode]:
    """The chunks' first `steps` env steps, the last chunk cut, as the learner's intake takes a PPO batch: whole
    chunks would make a batch a few steps over `minibatch_size`, and each epoch a second SGD step of those few."""
    batch, taken = [], 0
    for chunk in chunks:
        if taken >= steps:
            break
        batch.append(chunk if len(chunk) <= steps - taken else chunk.slice(slice(0, steps - taken)))
        taken += len(batch[-1])
    return batch


def trained_steps(spec: RunSpec, stats: dict[str, Any]) -> float:
    """The env steps a call's update(s) trained: PPO's batch; DQN's and SAC's updates at the training intensity
    (train_batch_size / training_intensity env steps each)."""
    if isinstance(spec.algorithm, PPOConfig):
        return stats["env_steps"]
    return stats["updates"] * spec.algorithm.steps_per_update()


def measure(spec: RunSpec, ranks: int, chunks: list[SingleAgentEpisode], updates: int, warmup: int) -> dict[str, Any]:
    """Median figures of `updates` timed calls of the trainer's update on these chunks by `ranks` data-parallel
    learners."""
    env = gym.make(spec.env.id)
    observation_space, action_space = env.observation_space, env.action_space
    module = build_rl_module(spec, observation_space, action_space, ImportPolicy())
    pipeline = build_learner_connector(spec, observation_space, action_space, ImportPolicy())
    trainer: Trainer | OffPolicyTrainer
    if isinstance(spec.algorithm, PPOConfig):
        trainer = Trainer(module, pipeline, spec.algorithm, max_staleness=10**9, seed=0)
    else:
        trainer = OffPolicyTrainer(module, pipeline, spec.algorithm, seed=0)
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
    steps, updates_per_call = 0.0, 0
    try:
        for i, episodes in enumerate(calls(spec, chunks, warmup + updates)):
            started = time.perf_counter()
            stats = trainer.update(episodes)
            seconds = time.perf_counter() - started
            if i >= warmup:
                steps, updates_per_call = trained_steps(spec, stats), stats.get("updates", 1)
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
    per_s = steps / median["update_s"]
    return {"ranks": ranks, "env_steps": steps, "updates": updates_per_call, "env_steps_per_s": per_s, **median}


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
    parser.add_argument("--algo", choices=sorted(ENVS), default="PPO", help="PPO, DQN (CartPole-v1), SAC (Pendulum-v1)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="learner ranks, one run per value")
    parser.add_argument("--train-batch-size", type=int, default=256)
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--num-epochs", type=int, default=20)
    parser.add_argument("--hiddens", type=int, nargs="+", help="the MLP's hidden layers (default: the preset's)")
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
    env_id = ENVS[args.algo]
    data = preset(env_id, args.algo)
    algorithm = {}
    if args.algo == "PPO":
        algorithm = {"train_batch_size": args.train_batch_size, "minibatch_size": args.minibatch_size}
        algorithm |= {"num_epochs": args.num_epochs}
    else:  # the preset's batch and replay ratio; updates from the first call on
        algorithm = {"num_steps_sampled_before_learning_starts": 0}
    data["algorithm"] |= algorithm
    if args.hiddens:
        data["model"] = {"config": {**data.get("model", {}).get("config", {}), "fcnet_hiddens": args.hiddens}}
    spec = RunSpec.model_validate({**data, "seed": 0})
    hiddens = spec.model.config.get("fcnet_hiddens")  # None: the default model's (64, 64)
    if isinstance(spec.algorithm, PPOConfig):
        steps = args.train_batch_size
    else:
        per_call = spec.algorithm.steps_per_update() * spec.algorithm.broadcast_interval
        steps = int(2 * per_call * (args.warmup + args.updates))  # calls take whole chunks: some more than per_call
    chunks = sample(spec, steps)
    for ranks in args.ranks:
        result = measure(spec, ranks, chunks, args.updates, args.warmup)
        print(json.dumps({**result, "algo": args.algo, **algorithm, "hiddens": hiddens, "threads": args.threads}))
    env = gym.make(env_id)
    module = build_rl_module(spec, env.observation_space, env.action_space, ImportPolicy())
    numel = sum(p.numel() for p in module.parameters())
    alone = allreduce_floor(numel + 7, args.calls)  # about Group.average's buffer: the gradients, the parts, a count
    print(json.dumps({"allreduce_alone_s": alone, "floats": numel + 7, "calls": args.calls}), flush=True)


if __name__ == "__main__":
    main()
