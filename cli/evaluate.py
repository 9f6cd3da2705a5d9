"""`rlgate eval`: run a checkpoint's policy for N episodes in its env (or another), report return and length.

    rlgate eval --checkpoint runs/CartPole-v1-20250101-120000/checkpoints --episodes 20
    rlgate eval --checkpoint ckpt/ --episodes 3 --video videos/ --json

Actions are greedy unless --explore. The env is the checkpoint's (its run spec's env id and kwargs); code
the checkpoint's spec names is imported only from modules given with --allow-import, while an env named
with --env is the operator's own choice. --video records every episode as mp4 with gymnasium's
RecordVideo, which needs the video extra (`pip install 'rlgate[video]'`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlgate.core.errors import ArgumentParser, UserError
from rlgate.policy import Policy, evaluate
from rlgate.policy.evaluate import make_eval_env
from rlgate.service.settings import require_device
from rlgate.spec import checkpoint
from rlgate.spec.imports import ImportPolicy


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="rlgate eval", description="Evaluate a checkpoint's policy in a local env.")
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (or a folder of them)")
    p.add_argument("--env", help="env id to evaluate in (as a run spec's env.id); default: the checkpoint's env")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    p.add_argument("--seed", type=int, help="episode i resets with seed + i; also seeds --explore's sampling")
    p.add_argument("--explore", action="store_true", help="sample actions instead of taking the most likely")
    p.add_argument("--video", type=Path, metavar="DIR", help="record every episode as mp4 here (needs moviepy)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module the checkpoint's run spec may name code in (repeatable)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="torch device of the forward pass")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as `args` say; the results (what --json prints)."""
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1, not {args.episodes}")
    require_device(args.device)
    found = checkpoint.find(args.checkpoint)
    try:
        policy = Policy.load(found, allow_import=args.allow_import, device=args.device, seed=args.seed)
    except FileNotFoundError as exc:  # e.g. a checkpoint from before run specs
        raise UserError(str(exc)) from None
    env_spec = policy.spec.env
    if args.env is not None:
        env_spec = env_spec.model_copy(update={"id": args.env, "kwargs": {}})
    allowed = [*args.allow_import, *([env_spec.module()] if args.env and env_spec.module() else [])]
    env = make_eval_env(env_spec, ImportPolicy(allowed), args.video)
    try:
        if (env.observation_space, env.action_space) != (policy.observation_space, policy.action_space):
            raise UserError(
                f"env {env_spec.id} has observations {env.observation_space} and actions {env.action_space}; "
                f"the policy in {found} takes {policy.observation_space} and {policy.action_space}"
            )
        result = evaluate(policy, env, args.episodes, explore=args.explore, seed=args.seed)
    finally:
        env.close()
    return {
        "checkpoint": str(found),
        "version": policy.version,
        "env_id": env_spec.id,
        "explore": args.explore,
        **result.summary(),
        "returns": result.returns,
        "lengths": result.lengths,
        "video_dir": None if args.video is None else str(args.video),
    }


def report(results: dict[str, Any]) -> str:
    """The results as a few lines a person reads."""
    actions = "sampled" if results["explore"] else "greedy"
    lines = [
        f"{results['env_id']}: {results['episodes']} episodes, {actions} actions, "
        f"checkpoint {results['checkpoint']} (version {results['version']})"
    ]
    for name in ("return", "length"):
        numbers = "  ".join(f"{stat} {_number(results[f'{name}_{stat}'])}" for stat in ("mean", "std", "min", "max"))
        lines.append(f"{name:<7} {numbers}")
    if results["video_dir"]:
        lines.append(f"videos: {results['video_dir']}")
    return "\n".join(lines)


def _number(value: float | int) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    results = run(args)
    print(json.dumps(results) if args.json else report(results))
    return 0
