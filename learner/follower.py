"""A data-parallel learner of rank 1 or more: it trains on the shards rank 0 sends, until rank 0 stops the group.

It builds its module from the run spec and spaces rank 0 sends, takes rank 0's weights and optimizer state, and
then runs each update as rank 0 does, on its shard, gradients all-reduced (Trainer.follow for PPO,
OffPolicyTrainer.follow for DQN and SAC: rank 0 holds the replay buffer). It serves nothing, reads no checkpoint
and writes none: rank 0 owns all of that.
"""

from __future__ import annotations

import logging
import signal

import torch

from rlgate.learner.data_parallel import Group, GroupFailed, Rendezvous, fail
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.settings import LearnerSettings
from rlgate.learner.trainer import Trainer
from rlgate.spec.algorithm import PPOConfig
from rlgate.spec.build import build_env_to_module, build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy

log = logging.getLogger(__name__)


def follow(settings: LearnerSettings, rendezvous: Rendezvous) -> int:
    """Join the group, train until rank 0 stops it; 0. A broken group ends the process (data_parallel.fail)."""
    # Rank 0 stops the group (after its final checkpoint); a terminal's Ctrl-C or torchrun's SIGTERM reaches every
    # rank, and a follower that ended first would break rank 0's stop.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    group = Group(rendezvous, settings.rendezvous_timeout_s)
    versions = 0  # trained (not undone)
    try:
        start = group.receive_start()
        spec, action_space = start.spec, start.action_space
        # Rank 0's operator chose this spec (rank 0 imports its code too).
        imports = ImportPolicy([*settings.allow_import, *spec.modules()])
        connectors = build_env_to_module(spec, start.observation_space, action_space, imports)
        assert connectors.observation_space is not None  # rank 0 checked the run (main.check_data_parallel)
        module = build_rl_module(spec, connectors.observation_space, action_space, imports)
        module.eval()
        pipeline = build_learner_connector(spec, module.observation_space, action_space, imports)  # rank 0 runs it
        # This rank's own draws: its minibatches' order, and the actions SAC samples for its rows (building the
        # module seeded torch's generator as it seeded rank 0's: the same draws would repeat on every shard).
        seed = None if spec.seed is None else spec.seed + group.rank
        if seed is None:
            torch.seed()
        else:
            torch.manual_seed(seed)
        trainer: Trainer | OffPolicyTrainer
        if isinstance(spec.algorithm, PPOConfig):
            trainer = Trainer(module, pipeline, spec.algorithm, max_staleness=0, seed=seed)
        else:
            trainer = OffPolicyTrainer(module, pipeline, spec.algorithm, seed=seed)
        trainer.join(group)
        while (update := group.receive_batch()) is not None:
            if trainer.follow(*update):
                versions += 1
    except GroupFailed as exc:
        fail(exc)
    log.info("learner rank %d: rank 0 stopped the group after %d versions", group.rank, versions)
    group.close()
    return 0
