"""Screen a preset's hyper-parameters: rlgate's learner fed by envs stepped in the same process.

The run spec's module, learner pipeline (GAE) and PPO update (`Trainer`), as the learner runs them, with
sampling as SB3's: `num_envs` envs stepped together for `rollout_fragment_length` steps by the model
being trained, then one update on all of it (on-policy, every episode cut at the window's end and
bootstrapped). No servers, no network, one process: a LunarLander run of 1M env steps takes about a
quarter of SB3's time, so several seeds of a candidate fit in one sitting. `rlgate up` then confirms the
values chosen. Specs with env-to-module pieces (MeanStdFilter) are out of its scope: it feeds the module
raw observations.

Run: `python -m rlgate.bench.screen --env LunarLander-v3 --seed 1 [--max-steps N] [--goal R]
[--set num_epochs=10 --set entropy_coeff=0.001 ...]`; one line per update (env steps, mean return of the
last 20 episodes, entropy, KL, clip fraction, explained variance), and when the goal was reached.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.trainer import Trainer
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.policy import build_learner_connector, build_rl_module
from rlgate.spec.presets import preset
from rlgate.spec.run import RunSpec

WINDOW = 20  # episodes in the mean return, as bench.learning's


def _spec(env: str, seed: int, overrides: list[str]) -> RunSpec:
    data = preset(env)
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            data.setdefault("algorithm", {})[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"--set {item}: the value must be JSON (a number, true, a schedule [[0, 0.01], ...])"
            ) from None
    spec = RunSpec.parse({**data, "seed": seed}, f"preset {env} with --set {overrides}")
    if spec.connectors.env_to_module or spec.model.module_class is not None:
        raise ValueError(f"{env}'s preset has env-to-module pieces or its own module: screen feeds the default model")
    return spec


def screen(env_id: str, seed: int, max_steps: int, goal: float, overrides: list[str]) -> int | None:
    """Train until the mean return of the last WINDOW episodes reaches `goal`; the env steps then, or None."""
    spec = _spec(env_id, seed, overrides)
    n, horizon = spec.env.num_envs, spec.sampling.rollout_fragment_length
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **spec.env.kwargs)] * n)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    imports = ImportPolicy()
    module = build_rl_module(spec, obs_space, act_space, imports).eval()
    trainer = Trainer(
        module, build_learner_connector(spec, obs_space, act_space, imports), spec.algorithm, max_staleness=0, seed=seed
    )
    dist_cls = module.get_exploration_action_dist_cls()
    obs, _ = envs.reset(seed=[seed + i for i in range(n)])
    episodes = [SingleAgentEpisode() for _ in range(n)]
    for i, episode in enumerate(episodes):
        episode.add_env_reset(obs[i])
    returns, running, steps, started = deque(maxlen=WINDOW), np.zeros(n), 0, time.monotonic()
    resetting = np.zeros(n, dtype=bool)  # NEXT_STEP autoreset: the next step of a done sub-env is its reset
    while steps < max_steps:
        batch = []
        for _ in range(horizon):
            with torch.inference_mode():
                outputs = module.forward_exploration({Columns.OBS: torch.from_numpy(obs)})
                dist = dist_cls.from_logits(outputs[Columns.ACTION_DIST_INPUTS])
                actions = dist.sample()
                logps = dist.logp(actions).numpy()
            actions = actions.numpy()
            obs, rewards, terminateds, truncateds, _ = envs.step(actions)
            for i in range(n):
                if resetting[i]:
                    episodes[i] = SingleAgentEpisode()
                    episodes[i].add_env_reset(obs[i])
                    continue
                extra = {Columns.ACTION_LOGP: logps[i], Columns.MODEL_VERSION: trainer.version}
                episodes[i].add_env_step(
                    obs[i],
                    actions[i],
                    float(rewards[i]),
                    terminated=bool(terminateds[i]),
                    truncated=bool(truncateds[i]),
                    extra_model_outputs=extra,
                )
                steps += 1
                running[i] += rewards[i]
                if episodes[i].is_done:
                    returns.append(running[i])
                    running[i] = 0.0
                    batch.append(episodes[i])
            resetting = terminateds | truncateds
        for i, episode in enumerate(episodes):
            if len(episode) and not episode.is_done:  # cut at the window's end: the rest goes on in the next
                batch.append(episode)
                episodes[i] = episode.cut()
        stats = trainer.update([episode.to_numpy() for episode in batch])
        mean = float(np.mean(returns)) if returns else float("nan")
        print(
            f"{steps:>9} env steps {time.monotonic() - started:6.0f} s  return {mean:7.1f}  entropy "
            f"{stats['entropy']:.3f}  kl {stats['kl']:.4f}  clip {stats['clip_fraction']:.3f}  "
            f"explained var {stats['explained_variance']:.2f}",
            flush=True,
        )
        if len(returns) == WINDOW and mean >= goal:
            return steps
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="an env with a preset, e.g. LunarLander-v3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--goal", type=float, default=200.0, help="mean return of the last 20 episodes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="an [algorithm] value")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per run: screen several seeds side by side
    try:
        reached = screen(args.env, args.seed, args.max_steps, args.goal, args.set)
    except ValueError as exc:  # SpecError is one
        parser.error(str(exc))
    print(f"reached {args.goal:g} at {reached} env steps" if reached else f"missed {args.goal:g}")


if __name__ == "__main__":
    main()
