"""`rlgate episodes DIR`: what a directory of recorded episodes holds (`rlgate serve --episode-dir DIR`).

Python reads the episodes themselves with `rlgate.storage.episode_files.read_episodes(DIR)`.
"""

from __future__ import annotations

import json
from typing import Any

from rlgate.core.errors import ArgumentParser, UserError
from rlgate.storage.episode_files import summarize


def report(summary: dict[str, Any]) -> str:
    """The summary as a few lines a person reads."""

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    versions = summary["model_versions"]
    return "\n".join(
        [
            f"{summary['directory']}: {summary['env_id'] or 'env unknown'}",
            f"observations {summary['observation_space']}, actions {summary['action_space']}",
            f"{summary['chunks']} chunks of {summary['episodes']} episodes ({summary['finished_episodes']} to their "
            f"end, {summary['terminated_episodes']} terminated), {summary['env_steps']} env steps",
            f"return of finished episodes: mean {number(summary['return_mean'])}  min {number(summary['return_min'])}"
            f"  max {number(summary['return_max'])}; mean length {number(summary['length_mean'])}",
            f"model versions {versions[0]} to {versions[1]}" if versions else "model versions unknown",
        ]
    )


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="rlgate episodes", description="Summarize recorded episode files.")
    parser.add_argument("directory", help="a server's --episode-dir")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.directory)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(summary) if args.json else report(summary))
    return 0
