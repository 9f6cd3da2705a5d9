"""The `rlgate` command: one subcommand per service; each parses its own settings (env vars, then flags).

A user's mistake never shows a traceback: whatever a command raises as `UserError`, and a flag or variable
that fails validation, ends it with one line `rlgate: <message>` on stderr and exit status 2.
"""

import argparse
import importlib
import json
import logging
import os
import re
import sys
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from rlgate.core.errors import UserError

# name -> (module whose `main(argv)` runs it, one-line help). Only commands that exist are listed.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("rlgate.server.command", "run the inference server"),
    "env": ("rlgate.client.main", "run env clients against a server"),
    "learn": ("rlgate.learner.command", "run the learner: trains on the servers' episodes, pushes weights"),
    "up": ("rlgate.cli.up", "train locally: learner, server and env clients as processes, until a return is reached"),
    "bench": ("rlgate.bench.main", "measure throughput and latency against in-process and bare-gRPC floors"),
    "eval": ("rlgate.cli.evaluate", "evaluate a checkpoint's policy in its env (your own code: --allow-import PKG)"),
    "export": ("rlgate.cli.export", "write a checkpoint's policy as an ONNX file (docs/onnx.md)"),
    "episodes": ("rlgate.cli.episodes", "summarize a directory of recorded episodes (rlgate serve --episode-dir)"),
}
USAGE_ERROR = 2


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
    except (UserError, ValidationError, SettingsError) as exc:
        print(f"rlgate: {user_message(exc)}", file=sys.stderr, flush=True)
        return USAGE_ERROR


def user_message(error: Exception) -> str:
    """One line for a user's mistake; a validation error names the flags (`--max-batch-size`), not fields."""
    if isinstance(error, ValidationError):
        return "; ".join(_one_error(e) for e in error.errors(include_url=False))
    if isinstance(error, SettingsError):
        return _settings_error(error)
    return " ".join(str(error).split())


# How pydantic-settings names the field whose flag or variable value did not parse (the cause is chained).
_UNPARSED = re.compile(r'error parsing value for field "([\w.]+)"|Parsing error encountered for ([\w.]+):')


def _settings_error(error: SettingsError) -> str:
    """A value that did not parse, said with its flag and why: pydantic-settings' own words name neither."""
    text = " ".join(str(error).split()).removeprefix("error parsing CLI: ")
    found = _UNPARSED.search(text)
    if found is None or error.__cause__ is None:
        return text
    flag = flag_name(tuple((found[1] or found[2]).split(".")))
    if isinstance(error.__cause__, json.JSONDecodeError):
        return f"{flag}: not valid JSON: {error.__cause__}"
    return f"{flag}: not valid JSON, nor key=value pairs"


def _one_error(error: Any) -> str:
    from rlgate.spec.run import algorithm_error  # here: the command line imports the spec only when it needs it

    error = algorithm_error(error)
    message = " ".join(error["msg"].removeprefix("Value error, ").split())
    loc = error["loc"]
    if not loc:  # a check across fields: its message names the flags
        return message
    got = error.get("input")
    shown = f" (got {got!r})" if isinstance(got, str | int | float) and error["type"] != "missing" else ""
    return f"{flag_name(loc)}: {message[:1].lower()}{message[1:]}{shown}"


def flag_name(loc: tuple[str | int, ...]) -> str:
    """('spec', 'algorithm', 'train_batch_size') -> '--spec.algorithm.train-batch-size' (list items as [i])."""
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else f"{'.' if name else ''}{part.replace('_', '-')}"
    return f"--{name}"
