"""`rlgate learn`: its settings are read before the learner's imports (torch, gRPC: ~2 s of a start), so a mistake
on the command line is answered at once."""

from __future__ import annotations

from rlgate.learner.settings import LearnerSettings


def main(argv: list[str]) -> int:
    settings = LearnerSettings(_cli_parse_args=argv, _cli_prog_name="rlgate learn")
    from rlgate.learner.main import learn  # the learner itself, once its settings are known to be good

    return learn(settings)
