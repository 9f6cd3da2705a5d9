"""The `rlgate` command: one subcommand per service; each parses its own settings (env vars, then flags)."""

import argparse
import importlib
import logging
import os
import sys

from rlgate.cli.usage import UsageError
from rlgate.spec.imports import SpecError

# name -> (module whose `main(argv)` runs it, one-line help). Only commands that exist are listed.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("rlgate.server.main", "run the inference server"),
    "env": ("rlgate.client.main", "run env clients against a server"),
    "learn": ("rlgate.learner.main", "run the learner: trains on the servers' episodes, pushes weights"),
    "up": ("rlgate.cli.up", "train locally: learner, server and env clients as processes, until a return is reached"),
    "bench": ("rlgate.bench.main", "measure throughput and latency against in-process and bare-gRPC floors"),
    "eval": ("rlgate.cli.evaluate", "evaluate a checkpoint's policy in its env: return and length, optionally video"),
    "episodes": ("rlgate.cli.episodes", "summarize a directory of recorded episodes (rlgate serve --episode-dir)"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; `rlgate SUBCOMMAND --help` lists that subcommand's settings."""
    parser = argparse.ArgumentParser(
        prog="rlgate", description="Serve RL policies to remote environments over gRPC, and train them."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        commands.add_parser(name, help=help_text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    # A run spec names the user's code by import path: find it in the working directory too, as `python -m`
    # would, but after everything installed, so nothing there can shadow an installed package.
    sys.path.append(os.getcwd())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.main(rest) or 0)
    except (UsageError, SpecError) as exc:  # the user's to fix: one line, no traceback
        print(f"rlgate {args.command}: {exc}", file=sys.stderr)
        return 2
