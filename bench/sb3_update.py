"""rlgate's PPO update against Stable-Baselines3's on the same rollout, weights and minibatch order.

SB3 collects one rollout of LunarLander-v3 (4 envs, rl-zoo's gamma, lambda and entropy coefficient) and
trains on it; rlgate's learner pipeline (GAE) and `ppo_update` run on the same steps, from the same
initial weights, with the same minibatch permutations. Printed: the largest difference of the value
targets and advantages, and of every weight after the update (next to how far the update moved it).
Differences of float32 rounding (~1e-7) mean the two updates are the same algorithm, so a gap in learning
between rlgate and SB3 lies in the data, not in the update.

One deliberate difference is taken out first: rlgate standardises advantages over the whole batch (RLlib's
GAE connector), SB3 per minibatch; SB3 here gets the batch-standardised advantages and no normalisation of
its own. Run: `python -m rlgate.bench.sb3_update [--seed 0] [--steps 256] [--epochs 4]` (needs the bench
extra).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np
import torch

from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.adam import Adam
from rlgate.learner.ppo import ppo_update
from rlgate.models import build_module
from rlgate.spec.algorithm import PPOConfig

ENV_ID, NUM_ENVS, MINIBATCH, GAMMA, LAMBDA, LR, ENTROPY = "LunarLander-v3", 4, 64, 0.999, 0.98, 3e-4, 0.01
#: rlgate's default module's parameters -> SB3's MlpPolicy's (separate policy and value networks).
SB3_NAMES = {
    "encoder.hidden.0": "mlp_extractor.policy_net.0",
    "encoder.hidden.1": "mlp_extractor.policy_net.2",
    "vf_encoder.hidden.0": "mlp_extractor.value_net.0",
    "vf_encoder.hidden.1": "mlp_extractor.value_net.2",
    "pi.out": "action_net",
    "vf.out": "value_net",
}


class _Permutations:
    """Hands out the same fixed permutations to both sides (rlgate calls `rng.permutation(n)` per epoch, SB3's
    rollout buffer `np.random.permutation(n)`)."""

    def __init__(self, perms: list[np.ndarray]) -> None:
        self._it: Iterator[np.ndarray] = iter(perms)

    def permutation(self, _n: int) -> np.ndarray:
        return next(self._it)


def _episodes(buffer, last_obs: np.ndarray, last_dones: np.ndarray) -> list[SingleAgentEpisode]:
    """The rollout's steps as rlgate episodes, env by env (SB3's flattened order). An episode that ended in
    the rollout ended terminated: none can be truncated, the rollout being shorter than the time limit."""
    episodes = []
    steps = buffer.observations.shape[0]
    for env in range(buffer.observations.shape[1]):
        episode = None
        for t in range(steps):
            if episode is None or buffer.episode_starts[t, env]:
                if episode is not None:
                    episode.is_terminated = True
                    episodes.append(episode)
                episode = SingleAgentEpisode()
                episode.add_env_reset(buffer.observations[t, env])
            following = buffer.observations[t + 1, env] if t + 1 < steps else last_obs[env]
            logp = {Columns.ACTION_LOGP: np.float32(buffer.log_probs[t, env])}
            action = np.int64(buffer.actions[t, env, 0])
            episode.add_env_step(following, action, float(buffer.rewards[t, env]), extra_model_outputs=logp)
        assert episode is not None  # the rollout has steps
        episode.is_terminated = bool(last_dones[env])
        episodes.append(episode)
    return [episode.to_numpy() for episode in episodes]


def compare(seed: int, steps: int, epochs: int) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Run both updates. Returns max |rlgate - SB3| of the value targets and advantages, and per weight
    (max |rlgate - SB3|, how far SB3's update moved it)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common import buffers
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    if steps >= 1000:
        raise ValueError("--steps must stay under LunarLander's time limit (1000), so that no episode is truncated")
    env = make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed)
    sb3 = PPO(
        "MlpPolicy",
        env,
        n_steps=steps,
        batch_size=MINIBATCH,
        n_epochs=epochs,
        gamma=GAMMA,
        gae_lambda=LAMBDA,
        learning_rate=LR,
        ent_coef=ENTROPY,
        normalize_advantage=False,
        seed=seed,
    )
    sb3.set_logger(Logger(None, []))  # SB3's default logger leaves an empty /tmp/SB3-<time> folder per run
    _, callback = sb3._setup_learn(steps * NUM_ENVS, None)
    callback.on_training_start(locals(), globals())
    sb3.collect_rollouts(sb3.env, callback, sb3.rollout_buffer, n_rollout_steps=steps)
    buffer = sb3.rollout_buffer
    start = {name: value.clone() for name, value in sb3.policy.state_dict().items()}

    module = build_module(env.observation_space, env.action_space).eval()
    pairs = [(f"{ours}.{p}", f"{theirs}.{p}") for ours, theirs in SB3_NAMES.items() for p in ("weight", "bias")]
    module.load_state_dict({ours: start[theirs] for ours, theirs in pairs})
    pipeline = build_learner_pipeline(env.observation_space, env.action_space, gae=(GAMMA, LAMBDA))
    episodes = _episodes(buffer, sb3._last_obs, sb3._last_episode_starts)
    batch = pipeline(rl_module=module, batch={}, episodes=episodes, explore=False, shared_data={})
    mask = batch[Columns.LOSS_MASK].bool()

    def flat(column: np.ndarray) -> np.ndarray:
        return column.swapaxes(0, 1).reshape(-1)

    advantages = flat(buffer.advantages)
    mean, std = advantages.mean(), max(1e-4, float(advantages.std()))
    gae = {
        "value targets": float(np.abs(batch[Columns.VALUE_TARGETS][mask].numpy() - flat(buffer.returns)).max()),
        "advantages": float(np.abs(batch[Columns.ADVANTAGES][mask].numpy() - (advantages - mean) / std).max()),
    }
    perms = [np.random.default_rng(seed + 1 + i).permutation(steps * NUM_ENVS) for i in range(epochs)]
    buffers.np.random.permutation = _Permutations(perms).permutation  # SB3's buffer draws its order here
    buffer.advantages = ((buffer.advantages - mean) / std).astype(np.float32)
    sb3.train()

    config = PPOConfig(
        train_batch_size=steps * NUM_ENVS,
        minibatch_size=MINIBATCH,
        num_epochs=epochs,
        gamma=GAMMA,
        lambda_=LAMBDA,
        lr=LR,
        entropy_coeff=ENTROPY,
    )
    # The Trainer's Adam; _Permutations stands in for the Generator (ppo_update calls only its permutation).
    ppo_update(module, Adam(module.parameters(), LR), batch, config, _Permutations(perms))  # type: ignore[arg-type]
    ours, theirs = module.state_dict(), sb3.policy.state_dict()
    weights = {
        name: (
            float((ours[name] - theirs[sb3_name]).abs().max()),
            float((theirs[sb3_name] - start[sb3_name]).abs().max()),
        )
        for name, sb3_name in pairs
    }
    return gae, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=256, help="rollout steps per env (< 1000)")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    try:
        gae, weights = compare(args.seed, args.steps, args.epochs)
    except ValueError as exc:
        parser.error(str(exc))
    for name, difference in gae.items():
        print(f"{name:>28}: max |rlgate - SB3| {difference:.2e}")
    for name, (difference, moved) in weights.items():
        print(f"{name:>28}: max |rlgate - SB3| {difference:.2e} (the update moved it {moved:.2e})")


if __name__ == "__main__":
    main()
