"""Screen a preset's hyper-parameters: rlgate's learner fed by envs stepped in the same process.

The run spec's module, learner pipeline and trainer (PPO's `Trainer`, DQN's and SAC's `OffPolicyTrainer`), as
the learner runs them, with sampling as SB3's: `num_envs` envs stepped together for `rollout_fragment_length`
steps by the model being trained (its exploration forward, then GetActions and the actions unsquashed to the
env's bounds, as a server acts), then PPO's one update on all of it (on-policy, every episode cut at the
window's end and bootstrapped), or every update DQN's and SAC's replay ratio has earned. No servers, no network,
one process: a LunarLander run of 1M env steps takes about a quarter of SB3's time, so several seeds of a
candidate fit in one sitting. `rlgate up` then confirms the values chosen. Specs with env-to-module pieces
(MeanStdFilter) are out of its scope: it feeds the module raw observations.

Run: `python -m rlgate.bench.screen --env LunarLander-v3 [--algo DQN] --seed 1 [--max-steps N] [--goal R]
[--set num_epochs=10 --set entropy_coeff=0.001 ...]`; one line per update (env steps, mean return of the
last 20 episodes and the update's diagnostics), and when the goal was reached.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch

from rlgate.connectors.module_to_env import GetActions
from rlgate.connectors.module_to_env.normalize_and_clip_actions import unsquash_action
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.trainer import Trainer
from rlgate.spec.algorithm import DQNConfig, SACConfig
from rlgate.spec.build import build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.presets import preset
from rlgate.spec.run import RunSpec

WINDOW = 20  # episodes in the mean return, as bench.learning's
# The update's diagnostics printed, those its algorithm gives.
DIAGNOSTICS = (
    "entropy", "kl", "clip_fraction", "explained_variance", "qf_loss", "qf_mean", "td_error_mean", "policy_loss",
    "alpha", "epsilon", "staleness",
)  # fmt: skip


def _spec(env: str, algorithm: str, seed: int, overrides: list[str]) -> RunSpec:
    data = preset(env, algorithm)
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


def screen(
    env_id: str, seed: int, max_steps: int, goal: float, overrides: list[str], algorithm: str = "PPO"
) -> int | None:
    """Train until the mean return of the last WINDOW episodes reaches `goal`; the env steps then, or None."""
    spec = _spec(env_id, algorithm, seed, overrides)
    n, horizon = spec.env.num_envs, spec.sampling.rollout_fragment_length
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **spec.env.kwargs)] * n)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    imports = ImportPolicy()
    module = build_rl_module(spec, obs_space, act_space, imports).eval()
    pipeline = build_learner_connector(spec, obs_space, act_space, imports)
    if isinstance(spec.algorithm, DQNConfig | SACConfig):  # OFF_POLICY
        trainer: Trainer | OffPolicyTrainer = OffPolicyTrainer(module, pipeline, spec.algorithm, seed=seed)
    else:
        trainer = Trainer(module, pipeline, spec.algorithm, max_staleness=0, seed=seed)
    obs, _ = envs.reset(seed=[seed + i for i in range(n)])
    episodes = [SingleAgentEpisode() for _ in range(n)]
    for i, episode in enumerate(episodes):
        episode.add_env_reset(obs[i])
    returns: deque[float] = deque(maxlen=WINDOW)
    running, steps, started = np.zeros(n), 0, time.monotonic()
    resetting = np.zeros(n, dtype=bool)  # NEXT_STEP autoreset: the next step of a done sub-env is its reset
    while steps < max_steps:
        batch = []
        for _ in range(horizon):
            with torch.inference_mode():
                outputs = module.forward_exploration({Columns.OBS: torch.from_numpy(obs)})
                outputs = GetActions()(rl_module=module, batch=outputs, episodes=[], explore=True)
            actions = outputs[Columns.ACTIONS].numpy()
            extras = {Columns.MODEL_VERSION: np.full(n, trainer.version)}
            if Columns.ACTION_LOGP in outputs:
                extras[Columns.ACTION_LOGP] = outputs[Columns.ACTION_LOGP].numpy()
            obs, rewards, terminateds, truncateds, _ = envs.step(unsquash_action(actions, act_space))
            for i in range(n):
                if resetting[i]:
                    episodes[i] = SingleAgentEpisode()
                    episodes[i].add_env_reset(obs[i])
                    continue
                episodes[i].add_env_step(
                    obs[i],
                    actions[i],
                    float(rewards[i]),
                    terminated=bool(terminateds[i]),
                    truncated=bool(truncateds[i]),
                    extra_model_outputs={key: values[i] for key, values in extras.items()},
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
        while isinstance(trainer, OffPolicyTrainer) and trainer.owed_updates():
            stats = trainer.update([])
        mean = float(np.mean(returns)) if returns else float("nan")
        shown = "  ".join(f"{key} {stats[key]:.4g}" for key in DIAGNOSTICS if key in stats)
        print(f"{steps:>9} env steps {time.monotonic() - started:6.0f} s  return {mean:7.1f}  {shown}", flush=True)
        if len(returns) == WINDOW and mean >= goal:
            return steps
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="an env with a preset, e.g. LunarLander-v3")
    parser.add_argument("--algo", default="PPO", choices=["PPO", "DQN", "SAC"], help="whose preset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=1_000_000)
    parser.add_argument("--goal", type=float, default=200.0, help="mean return of the last 20 episodes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="an [algorithm] value")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per run: screen several seeds side by side
    try:
        reached = screen(args.env, args.seed, args.max_steps, args.goal, args.set, args.algo)
    except ValueError as exc:  # SpecError is one
        parser.error(str(exc))
    print(f"reached {args.goal:g} at {reached} env steps" if reached else f"missed {args.goal:g}")


if __name__ == "__main__":
    main()
