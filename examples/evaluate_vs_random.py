"""Play a two-player game's checkpoint (connect_four.toml, tictactoe.toml) against a uniformly random player.

    python -m examples.evaluate_vs_random runs/<run>/checkpoints --games 1000

The game is the checkpoint's env (a PettingZoo classic AECEnv). One module of the checkpoint (`--module`; by
default the first the run trains, "main" in the self-play examples) plays every seat it takes greedily (its
inference action), half of the games as the first player and half as the second; the random player picks
uniformly among the legal moves. An illegal move by the module loses the game (PettingZoo's rule). Prints
the win, draw and loss rates per seat and overall.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch

from rlgate.connectors.env_to_module.flatten_observations import flatten_batch
from rlgate.core.columns import Columns
from rlgate.core.tree import batch
from rlgate.models import load_weights
from rlgate.spec.env import env_factory
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import build_multi_agent_env_to_module, build_multi_rl_module, modules_to_train
from rlgate.storage import checkpoint


def load_policy(directory: Path, module_id: str | None) -> tuple:
    """A function (agent id, observation) -> the greedy action of the checkpoint's module `module_id` (None:
    the first one it trains), and a maker of its env."""
    found = checkpoint.load(directory)
    spaces = {a: (found.observation_space[a], found.action_space[a]) for a in found.observation_space.spaces}
    imports = ImportPolicy(found.spec.modules())
    pipeline = build_multi_agent_env_to_module(found.spec, spaces, imports)
    modules = {m: (pipeline.observation_space[m], pipeline.action_space[m]) for m in pipeline.observation_space.spaces}
    module = build_multi_rl_module(found.spec, modules, imports)
    for name, weights in found.module_weights.items():
        load_weights(module[name], weights)
    module.eval()
    module_id = module_id or modules_to_train(found.spec, list(modules))[0]
    if module_id not in modules:
        raise ValueError(f"--module: the checkpoint has modules {list(modules)}, not {module_id!r}")
    sub = module[module_id]

    def act(agent: str, observation: dict) -> int:
        flat = flatten_batch(batch([observation]), spaces[agent][0])
        with torch.inference_mode():
            logits = sub.forward_inference({Columns.OBS: torch.from_numpy(flat)})[Columns.ACTION_DIST_INPUTS]
        dist = sub.get_inference_action_dist_cls().from_logits(logits)
        return int(dist.to_deterministic().sample()[0])

    return act, env_factory(found.spec.env, imports)


def play(act, make_env, trained_seat: str, rng: random.Random, seed: int) -> float:
    """One game; the trained player's final reward (1 win, 0 draw, -1 loss)."""
    env = make_env()
    env.reset(seed=seed)
    result = 0.0
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _ = env.last()
        if agent == trained_seat:
            result = reward
        if terminated or truncated:
            env.step(None)
            continue
        if agent == trained_seat:
            env.step(act(agent, observation))
        else:
            env.step(rng.choice(np.flatnonzero(observation["action_mask"]).tolist()))
    env.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--games", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--module", help="the module that plays (default: the first the run trains)")
    args = parser.parse_args()
    try:
        act, make_env = load_policy(args.checkpoint, args.module)
    except ValueError as exc:
        parser.error(str(exc))
    rng = random.Random(args.seed)
    seats = make_env().possible_agents
    results = {}
    for seat in seats:
        outcomes = [play(act, make_env, seat, rng, args.seed + i) for i in range(args.games // 2)]
        results[seat] = outcomes
        wins, draws = sum(o > 0 for o in outcomes), sum(o == 0 for o in outcomes)
        print(f"as {seat}: win {wins / len(outcomes):.3f}  draw {draws / len(outcomes):.3f}  "
              f"loss {(len(outcomes) - wins - draws) / len(outcomes):.3f}  ({len(outcomes)} games)")  # fmt: skip
    every = [outcome for seat in seats for outcome in results[seat]]
    print(f"overall win rate {sum(o > 0 for o in every) / len(every):.3f} over {len(every)} games")


if __name__ == "__main__":
    main()
