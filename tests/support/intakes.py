"""Handing an intake a batch as the learner's service does: decoded first."""

from __future__ import annotations

from rlgate.learner.intake import Intake
from rlgate.v1 import learner_pb2


def accept(intake: Intake, batch: learner_pb2.EpisodeBatch) -> learner_pb2.EpisodeAck:
    """`batch` decoded by `intake`'s decoder, then taken (what the learner does with a batch it receives)."""
    return intake.accept(intake.decoder.decode(batch))
