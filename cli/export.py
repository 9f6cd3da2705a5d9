"""`rlgate export`: a checkpoint's policy as one ONNX file, to act where the env runs (docs/onnx.md).

    rlgate export --checkpoint runs/CartPole-v1-20250101-120000/checkpoints --output cartpole.onnx
    rlgate export --checkpoint ckpt/ --output pendulum.onnx --explore
    rlgate export --checkpoint ckpt/ --output main.onnx --module main        # one module of a multi-agent run

The file takes the observation as the env emits it and gives the action as the env takes it: the run's fixed-form
env-to-module pieces are folded in, its module-to-env pieces too. --explore adds a noise input (the graph then
samples, and gives the action's log-probability); --module-only exports the module and action selection alone,
its inputs the module's.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlgate.core.errors import ArgumentParser, UserError


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="rlgate export", description="Write a checkpoint's policy as an ONNX file.")
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (or a folder of them)")
    p.add_argument("--output", type=Path, required=True, help="the .onnx file to write")
    p.add_argument("--module", help="the module to export (a multi-agent run's module id)")
    p.add_argument("--explore", action="store_true", help="sample actions from a noise input (and give their logp)")
    p.add_argument("--module-only", action="store_true", help="the module alone: no env-to-module pieces folded in")
    p.add_allow_import()
    args = p.parse_args(argv)
    folder = args.output.parent
    if args.output.is_dir():
        raise UserError(f"--output {args.output} is a directory: name the .onnx file to write")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UserError(f"--output {args.output}: {folder} is not a directory this user may write in")
    from rlgate.export.checkpoint import export_checkpoint  # torch and onnx (~2 s), once the arguments are good

    data = export_checkpoint(
        args.checkpoint,
        module_id=args.module,
        explore=args.explore,
        module_only=args.module_only,
        allow_import=args.allow_import,
    )
    try:
        args.output.write_bytes(data)
    except OSError as exc:
        raise UserError(f"--output {args.output}: {exc.strerror}") from None
    print(f"wrote {args.output} ({len(data):,} bytes)")
    return 0
