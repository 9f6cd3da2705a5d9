"""The training step: an update bumps the version and changes the weights; stale steps are masked and counted."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import pytest
import torch

from rlgate.core.columns import Columns
from rlgate.learner.trainer import Trainer
from rlgate.models import build_module, weights_to_bytes
from rlgate.spec.build import build_learner_connector, build_rl_module
from rlgate.spec.imports import ImportPolicy

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space
FAST_ALGORITHM = {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 2}  # conftest's FAST
ACTION_SPACE = gym.spaces.Discrete(2)


def trainer(learner_settings, version: int = 0) -> Trainer:
    spec = learner_settings().spec
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    return Trainer(module, pipeline, spec.algorithm, max_staleness=4, seed=spec.seed, version=version)


def test_an_update_bumps_the_version_changes_the_weights_and_reports_finite_losses(learner_settings, cartpole_chunks):
    chunks = cartpole_chunks(256)
    steps = sum(len(c) for c in chunks)  # before the update: the learner pipeline adds a bootstrap step to each
    t = trainer(learner_settings)
    before = weights_to_bytes(t.module)
    stats = t.update(chunks)
    assert t.version == 1
    assert weights_to_bytes(t.module) != before
    for key in ("policy_loss", "vf_loss", "entropy", "kl"):
        assert math.isfinite(stats[key]), key
    assert stats["entropy"] > 0  # a fresh policy on two actions is far from deterministic
    assert (stats["env_steps"], stats["stale_steps"], stats["staleness"]) == (steps, 0, 0.0)
    assert t.env_steps == steps
    t.update(cartpole_chunks(128, seed=1))
    assert t.version == 2 and t.env_steps > steps


def test_steps_older_than_max_staleness_are_masked_out_and_counted(learner_settings, cartpole_chunks):
    t = trainer(learner_settings, version=10)  # max_staleness 4: version 6 still counts, version 5 does not
    fresh = cartpole_chunks(100, version=6, seed=1)
    stale = cartpole_chunks(100, version=5, seed=2)
    fresh_steps, stale_steps = sum(len(c) for c in fresh), sum(len(c) for c in stale)
    stats = t.update(fresh + stale)
    assert stats["env_steps"] == fresh_steps + stale_steps
    assert stats["stale_steps"] == stale_steps
    assert stats["staleness"] == 4.0  # the mean over the steps used: all from version 6
    assert t.version == 11


def test_an_update_with_only_stale_steps_leaves_the_weights_alone(learner_settings, cartpole_chunks):
    t = trainer(learner_settings, version=10)
    stale = cartpole_chunks(64, version=2)
    steps = sum(len(c) for c in stale)
    before = weights_to_bytes(t.module)
    stats = t.update(stale)
    assert weights_to_bytes(t.module) == before
    assert stats["stale_steps"] == stats["env_steps"] == steps
    assert "policy_loss" not in stats


def test_steps_more_than_one_version_behind_train_with_vtrace_targets(learner_settings, cartpole_chunks):
    """The same chunks, through the same module, get other value targets when they lag the learner by two
    versions than by one (GAE); and an update on them trains."""
    chunks = cartpole_chunks(128, version=0)
    t = trainer(learner_settings, version=2)
    targets = {}
    for version in (1, 2):
        shared = {"learner_version": version}
        batch = t.pipeline(
            rl_module=t.module, batch={}, episodes=copy.deepcopy(chunks), explore=False, shared_data=shared
        )
        targets[version] = batch[Columns.VALUE_TARGETS]
    assert not torch.allclose(targets[1], targets[2])
    assert math.isfinite(t.update(chunks)["policy_loss"])


@pytest.mark.parametrize("proximal_clip", [False, True])
def test_a_stateful_module_trains_on_its_own_chunks(learner_settings, cartpole_chunks, proximal_clip):
    """An LSTM's train batch holds STATE_IN as a dict of tensors: its minibatches take rows leaf by leaf. Every
    update of a `use_lstm` run failed on it (KeyError), so examples/stateless_cartpole_lstm.yaml trained nothing."""
    lstm = {"config": {"use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4}}
    spec = learner_settings({"model": lstm, "algorithm": {**FAST_ALGORITHM, "proximal_clip": proximal_clip}}).spec
    chunks = cartpole_chunks(128, spec=spec)
    module = build_rl_module(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    assert module.is_stateful()
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    t = Trainer(module, pipeline, spec.algorithm, max_staleness=4, seed=spec.seed)
    before = weights_to_bytes(t.module)
    stats = t.update(chunks)
    assert t.version == 1 and weights_to_bytes(t.module) != before
    assert all(math.isfinite(stats[key]) for key in ("policy_loss", "vf_loss", "entropy", "kl")), stats


def test_a_module_written_rllibs_way_trains(learner_settings, cartpole_chunks):
    """Layers from `setup()`, the distribution from RLlib's default for Discrete, values from `compute_values`
    (tests/support/rllib_style_module.py): an update trains its policy and value layers."""
    spec = learner_settings({"model": {"module_class": "support.rllib_style_module:RLlibStyleModule"}}).spec
    module = build_rl_module(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy(["support"]))
    pipeline = build_learner_connector(spec, OBSERVATION_SPACE, ACTION_SPACE, ImportPolicy())
    t = Trainer(module, pipeline, spec.algorithm, max_staleness=4, seed=spec.seed)
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    stats = t.update(cartpole_chunks(128))
    assert t.version == 1
    assert all(math.isfinite(stats[key]) for key in ("policy_loss", "vf_loss", "entropy", "kl")), stats
    changed = {name for name, p in module.named_parameters() if not torch.equal(p, before[name])}
    assert {"pi.weight", "vf.weight", "body.0.weight"} <= changed
