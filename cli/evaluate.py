"""`rlgate eval`: run a checkpoint's policy for N episodes in its env (or another), report return and length.

    rlgate eval --checkpoint runs/CartPole-v1-20250101-120000/checkpoints --episodes 20
    rlgate eval --checkpoint ckpt/ --episodes 3 --video videos/ --json

Actions are greedy unless --explore. The env is the checkpoint's (its run spec's env id and kwargs); code the
checkpoint's spec names is imported only from modules given with --allow-import, while an env named with --env
is the operator's own choice. --video records every episode as mp4 with gymnasium's RecordVideo, which needs
the video extra (`pip install 'rlgate[video]'`). A multi-agent run's checkpoint plays its PettingZoo env
(parallel or AEC) and reports each agent's mean return too (an episode's return sums its agents').
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgate.core.errors import ArgumentParser, UserError
from rlgate.service.settings import require_device
from rlgate.spec.imports import ImportPolicy

if TYPE_CHECKING:  # at run time imported by `run`, once the arguments are known to be good (torch: ~2 s)
    from rlgate.policy import Evaluation, MultiAgentPolicy, Policy
    from rlgate.spec.run import EnvSpec


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="rlgate eval",
        description="Evaluate a checkpoint's policy in a local env. A checkpoint whose run spec names code of your "
        "own (an env mypkg.envs:MyEnv, a connector piece, a model) needs --allow-import mypkg.",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (or a folder of them)")
    p.add_argument("--env", help="env id to evaluate in (as a run spec's env.id); default: the checkpoint's env")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    p.add_argument("--seed", type=int, help="episode i resets with seed + i; also seeds --explore's sampling")
    p.add_argument("--explore", action="store_true", help="sample actions instead of taking the most likely")
    p.add_argument("--video", type=Path, metavar="DIR", help="record every episode as mp4 here (needs moviepy)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_allow_import()
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="torch device of the forward pass")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as `args` say; the results (what --json prints)."""
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1, not {args.episodes}")
    require_device(args.device)
    from rlgate.policy import MultiAgentPolicy, Policy
    from rlgate.storage import checkpoint

    found = checkpoint.find(args.checkpoint)
    try:
        loaded = checkpoint.load(found)
    except FileNotFoundError as exc:  # e.g. a checkpoint from before run specs
        raise UserError(str(exc)) from None
    kind = MultiAgentPolicy if loaded.module_weights is not None else Policy
    policy = kind.from_checkpoint(loaded, allow_import=args.allow_import, device=args.device, seed=args.seed)
    env_spec = policy.spec.env
    if args.env is not None:
        env_spec = env_spec.model_copy(update={"id": args.env, "kwargs": {}})
    env_module = env_spec.module() if args.env else None  # an --env named by its module is imported from it
    imports = ImportPolicy([*args.allow_import, *([env_module] if env_module else [])])
    if isinstance(policy, MultiAgentPolicy):
        result = _evaluate_multi_agent(policy, env_spec, imports, found, args)
    else:
        result = _evaluate(policy, env_spec, imports, found, args)
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


def _evaluate(policy: Policy, env_spec: EnvSpec, imports: ImportPolicy, found: Path, args: Any) -> Evaluation:
    from rlgate.policy import evaluate
    from rlgate.policy.evaluate import make_eval_env

    env = make_eval_env(env_spec, imports, args.video)
    try:
        if (env.observation_space, env.action_space) != (policy.observation_space, policy.action_space):
            raise UserError(
                f"env {env_spec.id} has observations {env.observation_space} and actions {env.action_space}; "
                f"the policy in {found} takes {policy.observation_space} and {policy.action_space}"
            )
        return evaluate(policy, env, args.episodes, explore=args.explore, seed=args.seed)
    finally:
        env.close()


def _evaluate_multi_agent(
    policy: MultiAgentPolicy, env_spec: EnvSpec, imports: ImportPolicy, found: Path, args: Any
) -> Evaluation:
    from rlgate.envs.agent_envs import AgentEnvs
    from rlgate.policy import evaluate_multi_agent
    from rlgate.spec.env import make_agent_envs

    if args.video is not None:
        raise UserError("--video records gymnasium envs: a multi-agent run's PettingZoo env is not recorded")
    env = make_agent_envs(env_spec, imports, 1)[0]
    try:
        for agent, spaces in AgentEnvs([env]).agent_spaces.items():
            served = policy.agent_spaces.get(agent)
            if spaces != served:
                known = ", ".join(policy.agent_spaces)
                takes = f"takes {served[0]} and {served[1]}" if served else f"has no such agent (agents: {known})"
                raise UserError(
                    f"env {env_spec.id}'s agent {agent!r} has observations {spaces[0]} and actions {spaces[1]}; "
                    f"the policy in {found} {takes}"
                )
        return evaluate_multi_agent(policy, env, args.episodes, explore=args.explore, seed=args.seed)
    finally:
        env.close()


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
    for agent, mean in results.get("agent_return_mean", {}).items():
        lines.append(f"agent {agent}: return mean {_number(mean)}")
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
