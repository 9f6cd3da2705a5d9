"""Trained policies in plain Python: load a checkpoint (or take a learner's weights), act, evaluate."""

from rlgate.policy.evaluate import Evaluation, evaluate, evaluate_multi_agent
from rlgate.policy.multi_agent_policy import MultiAgentPolicy, MultiAgentPolicyEpisode
from rlgate.policy.policy import Policy, PolicyEpisode

__all__ = [
    "Evaluation",
    "MultiAgentPolicy",
    "MultiAgentPolicyEpisode",
    "Policy",
    "PolicyEpisode",
    "evaluate",
    "evaluate_multi_agent",
]
