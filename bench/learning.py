"""Learning speed: `rlgate up` against Stable-Baselines3 with rl-zoo's settings, same envs, same machine.

Run: `python -m rlgate.bench.learning --envs CartPole-v1 Acrobot-v1 --seeds 0 1 2 [--algos PPO DQN SAC]` (needs the
`bench` extra: stable-baselines3, a bench-only dependency). For each env, algorithm (PPO by default; each env is run
with those of the algorithms given that rl-zoo tunes for it) and seed it runs, one after the other (never side by
side), `rlgate up --env ENV --algo A --seed S` (the env's preset for the algorithm) and an SB3 process of the same
algorithm with the rl-zoo hyper-parameters the preset cites, each until the mean return of its last 20 episodes
reaches the goal or its env-step budget runs out. Wall time counts from starting the process (imports and start-up
included) to the goal. Prints one line per run, then per env and algorithm the medians and rlgate / SB3 ratios.

SB3's PPO runs min(budget, rl-zoo's n_timesteps) env steps, its linear schedules over them. Its DQN and SAC run the
whole budget with rl-zoo's schedules kept on rl-zoo's n_timesteps: DQN's exploration over the same env steps
(exploration_fraction rescaled), linear learning rates falling to 0 at n_timesteps; and on one torch thread, as
rlgate's learner (PPO's SB3 runs keep torch's default, as they were measured).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlgate.service.process import process_started

# env -> (goal: mean return of the last 20 episodes, env-step budget), the targets of issues #16 and #38.
GOALS = {
    "CartPole-v1": (475.0, 100_000),
    "Acrobot-v1": (-100.0, 100_000),
    "Pendulum-v1": (-250.0, 100_000),
    "LunarLander-v3": (200.0, 1_000_000),
    "LunarLanderContinuous-v3": (200.0, 300_000),
    "MountainCarContinuous-v0": (90.0, 100_000),
}
WINDOW = 20

# rl-zoo's hyper-parameters (rl-baselines3-zoo, hyperparams/<algo>.yml), as the presets in spec/presets cite them.
# "lin_X" is a linear schedule from X to 0 over the zoo's n_timesteps.
ZOO_PPO: dict[str, dict] = {
    "CartPole-v1": {
        "n_envs": 8, "n_timesteps": 1e5, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
        "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
    },
    "Acrobot-v1": {
        "normalize": True, "n_envs": 16, "n_timesteps": 1e6, "n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99,
        "n_epochs": 4, "ent_coef": 0.0,
    },
    "Pendulum-v1": {
        "n_envs": 4, "n_timesteps": 1e5, "n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
        "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4,
    },
    "LunarLander-v3": {
        "n_envs": 16, "n_timesteps": 1e6, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999,
        "n_epochs": 4, "ent_coef": 0.01,
    },
    "MountainCarContinuous-v0": {
        "normalize": True, "n_envs": 1, "n_timesteps": 20000, "batch_size": 256, "n_steps": 8, "gamma": 0.9999,
        "learning_rate": 7.77e-05, "ent_coef": 0.00429, "clip_range": 0.1, "n_epochs": 10, "gae_lambda": 0.9,
        "max_grad_norm": 5, "vf_coef": 0.19, "use_sde": True,
        "policy_kwargs": {"log_std_init": -3.29, "ortho_init": False},
    },
}  # fmt: skip
ZOO_DQN: dict[str, dict] = {
    "CartPole-v1": {
        "n_timesteps": 5e4, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100000, "learning_starts": 1000,
        "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
        "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]},
    },
    "Acrobot-v1": {
        "n_timesteps": 1e5, "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50000, "learning_starts": 0,
        "gamma": 0.99, "target_update_interval": 250, "train_freq": 4, "gradient_steps": -1,
        "exploration_fraction": 0.12, "exploration_final_eps": 0.1, "policy_kwargs": {"net_arch": [256, 256]},
    },
}  # fmt: skip
ZOO_DQN["LunarLander-v3"] = ZOO_DQN["Acrobot-v1"]  # rl-zoo's LunarLander-v2 values are Acrobot's
ZOO_SAC: dict[str, dict] = {
    "Pendulum-v1": {"n_timesteps": 20000, "learning_rate": 1e-3},
    "LunarLanderContinuous-v3": {
        "n_timesteps": 5e5, "batch_size": 256, "learning_rate": "lin_7.3e-4", "buffer_size": 1000000,
        "ent_coef": "auto", "gamma": 0.99, "tau": 0.01, "train_freq": 1, "gradient_steps": 1,
        "learning_starts": 10000, "policy_kwargs": {"net_arch": [400, 300]},
    },
    "MountainCarContinuous-v0": {
        "n_timesteps": 5e4, "learning_rate": 3e-4, "buffer_size": 50000, "batch_size": 512, "ent_coef": 0.1,
        "train_freq": 32, "gradient_steps": 32, "gamma": 0.9999, "tau": 0.01, "learning_starts": 0, "use_sde": True,
        "policy_kwargs": {"log_std_init": -3.67, "net_arch": [64, 64]},
    },
}  # fmt: skip
ZOO = {"PPO": ZOO_PPO, "DQN": ZOO_DQN, "SAC": ZOO_SAC}


@dataclass
class Run:
    """One training run to the goal (or not)."""

    who: str
    env: str
    algo: str
    seed: int
    reached: bool
    mean_return: float
    env_steps: int
    wall_s: float  # from process start to the goal (or to the end of the budget)


def run_rlgate(env: str, algo: str, seed: int, goal: float, budget: int, run_dir: Path) -> Run:
    """`rlgate up --env ENV --algo A --seed S`: the env's preset for the algorithm, the embedded topology."""
    command = [sys.executable, "-m", "rlgate", "up", "--env", env, "--algo", algo, "--seed", str(seed)]
    command += ["--stop-return", str(goal)]
    command += ["--max-steps", str(budget), "--run-dir", str(run_dir)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    found = re.search(r"(reached|stopped at) return (\S+) (?:at|after) (\d+) env steps in (\S+) s", done.stdout)
    if found is None:
        raise RuntimeError(f"rlgate up failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    reached = found.group(1) == "reached"
    # up reports its own seconds to the goal; the process's start-up before its clock is in `elapsed` only.
    wall = float(found.group(4)) if reached else elapsed  # up counts from its own process start
    return Run("rlgate", env, algo, seed, reached, float(found.group(2)), int(found.group(3)), wall)


def run_sb3(env: str, algo: str, seed: int, goal: float, budget: int) -> Run:
    """SB3 with rl-zoo's settings, in a process of its own (its imports count, as rlgate's do)."""
    command = [sys.executable, "-m", "rlgate.bench.learning", "--sb3-child", env, algo, str(seed), str(goal)]
    command.append(str(budget))
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"SB3 run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    wall = result["goal_s"] if result["reached"] else time.monotonic() - started
    return Run("sb3", env, algo, seed, result["reached"], result["mean_return"], result["env_steps"], wall)


def sb3_child(env_id: str, algo: str, seed: int, goal: float, budget: int) -> None:
    """Train SB3's `algo` until the goal; print one JSON line. Seconds count from this process's start."""
    import numpy as np
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    started = process_started()
    if algo != "PPO":
        # One torch thread, as rlgate's learner trains under `rlgate up`: on a small, shared machine torch's default
        # pool made SB3's SAC ~20x slower per step (Pendulum seed 0 took 2,325 s to its goal, for ~90 s alone).
        import torch

        torch.set_num_threads(1)
    params = dict(ZOO[algo][env_id])
    n_envs, n_timesteps = params.pop("n_envs", 1), params.pop("n_timesteps")
    normalize = params.pop("normalize", False)
    # PPO keeps its budget within rl-zoo's n_timesteps (its schedules run over them); DQN and SAC run the budget.
    total = int(min(budget, n_timesteps)) if algo == "PPO" else budget
    for key in ("learning_rate", "clip_range"):
        if isinstance(params.get(key), str):  # "lin_X": X * the share of rl-zoo's n_timesteps still to come
            start = float(params[key].removeprefix("lin_"))
            params[key] = lambda remaining, x=start: x * max(0.0, 1 - (1 - remaining) * total / n_timesteps)
    if "exploration_fraction" in params:  # of rl-zoo's n_timesteps, not of the budget
        params["exploration_fraction"] *= n_timesteps / total
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env, gamma=params.get("gamma", 0.99))
    model = getattr(stable_baselines3, algo)("MlpPolicy", env, seed=seed, verbose=0, **params)
    model.set_logger(Logger(None, []))  # SB3's default logger leaves an empty /tmp/SB3-<time> folder per run

    class StopAtGoal(BaseCallback):
        reached_at: float | None = None

        def _on_step(self) -> bool:
            returns = [info["r"] for info in list(self.model.ep_info_buffer)[-WINDOW:]]
            if len(returns) >= WINDOW and np.mean(returns) >= goal:
                self.reached_at = time.monotonic()
                return False
            return True

    stop = StopAtGoal()
    model.learn(total_timesteps=total, callback=stop)
    returns = [info["r"] for info in list(model.ep_info_buffer)[-WINDOW:]]
    print(
        json.dumps(
            {
                "reached": stop.reached_at is not None,
                "goal_s": (stop.reached_at or time.monotonic()) - started,
                "mean_return": float(np.mean(returns)) if returns else float("nan"),
                "env_steps": int(model.num_timesteps),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rlgate.bench.learning", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1"], choices=sorted(GOALS))
    parser.add_argument("--algos", nargs="+", default=["PPO"], choices=sorted(ZOO))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--sb3-child", nargs=5, metavar=("ENV", "ALGO", "SEED", "GOAL", "BUDGET"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.sb3_child:
        env, algo, seed, goal, budget = args.sb3_child
        sb3_child(env, algo, int(seed), float(goal), int(budget))
        return
    pairs = [(env, algo) for env in args.envs for algo in args.algos if env in ZOO[algo]]
    if not pairs:
        parser.error(f"rl-zoo tunes none of {args.algos} for {args.envs}")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="rlgate-learning-") as scratch:
        for env, algo in pairs:
            goal, budget = GOALS[env]
            for seed in args.seeds:
                for run in (
                    run_rlgate(env, algo, seed, goal, budget, Path(scratch)),
                    run_sb3(env, algo, seed, goal, budget),
                ):
                    runs.append(run)
                    state = "reached" if run.reached else "missed"
                    print(
                        f"{run.env:>26} {algo:>3} seed {seed} {run.who:>6}: {state} {run.mean_return:8.1f} at "
                        f"{run.env_steps:>8,} env steps in {run.wall_s:6.1f} s",
                        flush=True,
                    )
    print()
    for env, algo in pairs:
        mine = [r for r in runs if (r.env, r.algo, r.who) == (env, algo, "rlgate")]
        theirs = [r for r in runs if (r.env, r.algo, r.who) == (env, algo, "sb3")]
        wall = statistics.median(r.wall_s for r in mine), statistics.median(r.wall_s for r in theirs)
        steps = statistics.median(r.env_steps for r in mine), statistics.median(r.env_steps for r in theirs)
        print(
            f"{env:>26} {algo:>3}: rlgate reached {sum(r.reached for r in mine)}/{len(mine)}, SB3 "
            f"{sum(r.reached for r in theirs)}/{len(theirs)}; median wall {wall[0]:.1f} s vs {wall[1]:.1f} s "
            f"(x{wall[0] / wall[1]:.2f}), median env steps {steps[0]:,.0f} vs {steps[1]:,.0f}"
        )


if __name__ == "__main__":
    main()
