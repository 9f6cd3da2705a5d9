"""bench.learners times PPO's update on the batch the live learner trains: whole chunks overshoot it by a few steps,
which made each epoch a second SGD step of those few."""

from __future__ import annotations

import numpy as np

from rlgate.bench.learners import calls, measure, sample
from rlgate.spec.presets import preset
from rlgate.spec.run import RunSpec


def test_a_ppo_call_trains_exactly_train_batch_size_steps_as_the_intake_cuts_them() -> None:
    spec = RunSpec.model_validate({**preset("CartPole-v1", "PPO"), "seed": 0})
    size = spec.algorithm.train_batch_size
    chunks = sample(spec, size)
    assert sum(map(len, chunks)) > size  # whole chunks overshoot: the case the cut is for
    (batch,) = calls(spec, chunks, 1)
    assert sum(map(len, batch)) == size
    cut = len(batch) - 1  # the last chunk kept is a head of the sampled one, with its observations and actions
    assert np.array_equal(batch[cut].get_actions(), chunks[cut].get_actions()[: len(batch[cut])])
    result = measure(spec, 1, chunks, updates=1, warmup=0)
    assert result["env_steps"] == size
