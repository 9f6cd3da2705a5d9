"""A data-parallel learner of rank 1 or more: it trains on the shards rank 0 sends, until rank 0 stops the group.

It builds its module from the run spec and spaces rank 0 sends, takes rank 0's weights and optimizer state, and
then runs each update as rank 0 does, on its shard, gradients all-reduced (Trainer.follow for PPO,
MultiAgentTrainer.follow for multi-agent PPO, module by module, OffPolicyTrainer.follow for DQN and SAC, single- and
multi-agent: rank 0 holds the replay buffers). It serves nothing, reads no checkpoint and writes none: rank 0 owns
all of that.

A follower that is the first process of its host (LOCAL_RANK unset or 0: a pod of its own) answers /healthz,
/readyz, /status and /metrics on http_port, as rank 0 does, so the pod's probes and scrape work for every rank;
followers that share rank 0's host (`--num-learners N`, torchrun with several processes per node) serve none.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import torch
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Gauge

from rlgate.learner.data_parallel import Group, GroupFailed, Rendezvous, Start, fail
from rlgate.learner.device import learner_device
from rlgate.learner.multi_agent_trainer import MultiAgentTrainer
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.settings import LearnerSettings
from rlgate.learner.trainer import Trainer
from rlgate.models import MultiRLModule, RLModule
from rlgate.service.http import ThreadedHttpServer, build_app
from rlgate.spec.algorithm import PPOConfig
from rlgate.spec.build import build_env_to_module, build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import (
    agent_spaces_of,
    build_multi_agent_env_to_module,
    build_multi_agent_learner_connector,
    build_multi_rl_module,
    modules_to_train,
    pipeline_module_spaces,
)

log = logging.getLogger(__name__)


def follow(settings: LearnerSettings, rendezvous: Rendezvous) -> int:
    """Join the group, train until rank 0 stops it; 0. A broken group ends the process (data_parallel.fail)."""
    # Rank 0 stops the group (after its final checkpoint); a terminal's Ctrl-C or torchrun's SIGTERM reaches every
    # rank, and a follower that ended first would break rank 0's stop.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    health = Health(rendezvous)
    http = None
    if os.environ.get("LOCAL_RANK", "0") == "0":
        http = ThreadedHttpServer(health.app(), settings.host, settings.http_port)
        http.start()
    try:
        _train(settings, rendezvous, health)
    finally:
        if http is not None:
            http.stop()
    return 0


def _train(settings: LearnerSettings, rendezvous: Rendezvous, health: Health) -> None:
    device = learner_device(settings)
    group = Group(rendezvous, settings.rendezvous_timeout_s, device, settings.collective_timeout_s)
    try:
        start = group.receive_start()
        # Rank 0's operator chose this spec (rank 0 imports its code too).
        imports = ImportPolicy([*settings.allow_import, *start.spec.modules()])
        # This rank's own draws: its minibatches' order, and the actions SAC samples for its rows (building the
        # module seeded torch's generator as it seeded rank 0's: the same draws would repeat on every shard).
        seed = None if start.spec.seed is None else start.spec.seed + group.rank
        trainer = build_trainer(start, imports, seed, device=device)
        trainer.join(group)
        health.joined = True
        while (update := group.receive_batch()) is not None:
            health.updates += trainer.follow(*update)
    except GroupFailed as exc:
        fail(exc)
    log.info("learner rank %d: rank 0 stopped the group after %d updates", group.rank, health.updates)
    group.close()


def build_trainer(
    start: Start, imports: ImportPolicy, seed: int | None, max_staleness: int = 0, device: torch.device | str = "cpu"
) -> Trainer | MultiAgentTrainer | OffPolicyTrainer:
    """The trainer of rank 0's run (single- or multi-agent, PPO, DQN or SAC), its modules built as the learner
    builds them, on `device` (a follower then takes rank 0's weights and optimizer states: `join`). Its draws (and
    torch's generator, after the modules are built) seeded with `seed`, or at random if None."""
    spec, observation_space, action_space = start.spec, start.observation_space, start.action_space
    module: RLModule | MultiRLModule
    if spec.multi_agent is None:
        connectors = build_env_to_module(spec, observation_space, action_space, imports)
        assert connectors.observation_space is not None  # built on the env's space
        module = build_rl_module(spec, connectors.observation_space, action_space, imports)
        # Rank 0 runs it.
        pipeline = build_learner_connector(spec, module.observation_space, action_space, imports, device=str(device))
    else:
        connectors = build_multi_agent_env_to_module(spec, agent_spaces_of(observation_space, action_space), imports)
        modules = pipeline_module_spaces(connectors)
        module = build_multi_rl_module(spec, modules, imports)
        pipeline = build_multi_agent_learner_connector(spec, modules, imports, device=str(device))
    module.to(device).eval()
    if seed is None:
        torch.seed()
    else:
        torch.manual_seed(seed)
    algorithm = spec.algorithm
    if not isinstance(module, MultiRLModule):
        if isinstance(algorithm, PPOConfig):
            return Trainer(module, pipeline, algorithm, max_staleness=max_staleness, seed=seed)
        return OffPolicyTrainer(module, pipeline, algorithm, seed=seed)
    assert spec.multi_agent is not None  # its modules
    trainable, count_steps_by = modules_to_train(spec, list(module)), spec.multi_agent.count_steps_by
    if isinstance(algorithm, PPOConfig):
        return MultiAgentTrainer(
            module,
            pipeline,
            algorithm,
            trainable=trainable,
            count_steps_by=count_steps_by,
            max_staleness=max_staleness,
            seed=seed,
        )
    return OffPolicyTrainer(module, pipeline, algorithm, seed=seed, trainable=trainable, count_steps_by=count_steps_by)


class Health:
    """What a follower's HTTP answers. Alive (/healthz) while the process runs: a group found broken ends it
    (data_parallel.fail). Ready (/readyz) too, saying so while it waits for rank 0: a follower takes no traffic, and
    its readiness only paces a StatefulSet's rolling update, which replaces rank N-1 first and waits for it to be
    ready before it replaces rank 0; the new rank cannot train with the old rank 0 (a group's members are fixed), so
    "ready once training" would stall the update."""

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous
        self.joined = False  # holds rank 0's run and state
        self.updates = 0
        self.registry = CollectorRegistry()
        updates = Gauge("rlgate_learner_rank_updates", "Updates this rank took part in.", registry=self.registry)
        updates.set_function(lambda: self.updates)

    def status(self) -> dict[str, Any]:
        r = self.rendezvous
        state = "training" if self.joined else f"waiting for rank 0 at {r.address}:{r.port}"
        return {"rank": r.rank, "world_size": r.size, "state": state, "updates": self.updates}

    def ready(self) -> tuple[bool, str | None]:
        return True, None if self.joined else self.status()["state"]

    def app(self) -> FastAPI:
        title = f"rlgate learner rank {self.rendezvous.rank}"
        return build_app(title, registry=self.registry, status=self.status, ready=self.ready)
