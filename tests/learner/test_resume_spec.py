"""Resuming a checkpoint: its run spec goes on, a compatible change is taken, another env or model is refused."""

from __future__ import annotations

import pytest

from rlgate.learner.learner import Learner
from rlgate.learner.main import LearnerServer
from rlgate.learner.settings import LearnerSettings
from rlgate.spec.imports import SpecError


@pytest.fixture
async def cartpole_checkpoint(learner_settings) -> None:
    """A learner of CartPole-v1 (fast settings) started and stopped: its final checkpoint in checkpoint_dir."""
    server = LearnerServer(learner_settings())
    await server.start()
    await server.stop()


async def test_resuming_with_no_spec_goes_on_with_the_checkpoints(cartpole_checkpoint, learner_settings):
    learner = Learner(LearnerSettings(checkpoint_dir=learner_settings().checkpoint_dir))
    assert learner.spec.env.id == "CartPole-v1" and learner.spec.algorithm.train_batch_size == 128


async def test_another_env_is_refused_naming_both(cartpole_checkpoint, learner_settings):
    with pytest.raises(SpecError) as refused:
        Learner(learner_settings(env="Acrobot-v1"))
    message = str(refused.value)
    assert "CartPole-v1" in message and "Acrobot-v1" in message and "--no-resume" in message


async def test_another_model_is_refused_naming_the_part(cartpole_checkpoint, learner_settings):
    with pytest.raises(SpecError, match="model"):
        Learner(learner_settings(spec={"model": {"config": {"fcnet_hiddens": [8]}}}))
    with pytest.raises(SpecError, match=r"connectors\.env_to_module"):
        Learner(learner_settings(spec={"connectors": {"env_to_module": ["MeanStdFilter"]}}))


async def test_new_hyper_parameters_are_taken_on_resume(cartpole_checkpoint, learner_settings):
    learner = Learner(learner_settings(spec={"algorithm": {"lr": 5e-4, "train_batch_size": 256}}))
    assert learner.spec.algorithm.lr == 5e-4
    assert learner.trainer.optimizer.param_groups[0]["lr"] == 5e-4  # not the checkpoint's optimizer's


async def test_no_checkpoint_and_no_spec_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"no run spec: pass --config run\.toml or --env"):
        Learner(LearnerSettings(checkpoint_dir=tmp_path))
