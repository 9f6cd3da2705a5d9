"""Trained policies in plain Python: load a checkpoint (or take a learner's weights), act, evaluate."""

from rlgate.policy.evaluate import Evaluation, evaluate
from rlgate.policy.policy import Policy, PolicyEpisode

__all__ = ["Evaluation", "Policy", "PolicyEpisode", "evaluate"]
