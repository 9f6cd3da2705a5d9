"""`--backend onnxruntime`: the acting core's forward pass in onnxruntime gives what torch gives (the same seed
samples the same actions), swaps to a new weights version once its session is built without holding a batch, and
a real server with it serves and records episodes as the torch backend's does."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from export.test_parity import FILTERED_FRAMES, LSTM, STATELESS, wide_weights
from support.servers import BOX4, DISCRETE2, RawStream, hello, shipped, step

from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.policy.acting import ActingCore
from rlgate.spec.imports import SpecError
from rlgate.spec.run import RunSpec

FAMILIES = {**STATELESS, "lstm": (BOX4, DISCRETE2, LSTM), "frame-stacking": (BOX4, DISCRETE2, FILTERED_FRAMES)}


def fresh_episodes(
    observation_space: gym.Space, action_space: gym.Space, count: int, seed: int
) -> tuple[list[SingleAgentEpisode], Any]:
    """Episodes just reset, and their observations as one batch (the server's fast path hands that in)."""
    observation_space.seed(seed)
    samples = [observation_space.sample() for _ in range(count)]
    made = []
    for sample in samples:
        episode = SingleAgentEpisode(observation_space=observation_space, action_space=action_space)
        episode.add_env_reset(sample)
        made.append(episode)
    return made, map_structure(lambda *leaves: np.stack(leaves), *samples)


def same(torch_outputs: dict, onnx_outputs: dict) -> None:
    assert set(onnx_outputs) == set(torch_outputs)
    for column, expected in torch_outputs.items():
        got = onnx_outputs[column]
        if column == Columns.STATE_OUT:
            for key in expected:
                np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-5)
        elif np.issubdtype(np.asarray(expected).dtype, np.floating):
            assert np.asarray(got).dtype == np.asarray(expected).dtype, column
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=column)
        else:
            assert np.asarray(got).dtype == np.asarray(expected).dtype, column
            np.testing.assert_array_equal(got, expected, err_msg=column)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_onnxruntime_core_acts_as_the_torch_core(family):
    observation_space, action_space, spec_fields = FAMILIES[family]
    spec = RunSpec.model_validate({**spec_fields, "seed": 3})
    weights = wide_weights(spec, observation_space, action_space, seed=1)
    cores = {
        backend: ActingCore.build(spec, observation_space, action_space, weights=weights, backend=backend)
        for backend in ("torch", "onnxruntime")
    }
    for i, explore in enumerate((False, True, True)):
        outputs = {}
        for backend, core in cores.items():
            made, batch = fresh_episodes(observation_space, action_space, 64, seed=i)
            torch.manual_seed(7 + i)  # both draw the same noise
            outputs[backend] = core.act(made, explore, None if core.module.is_stateful() else batch)
        same(outputs["torch"], outputs["onnxruntime"])
        assert (Columns.ACTION_LOGP in outputs["onnxruntime"]) is explore


def test_a_new_version_acts_once_its_session_is_built_and_no_batch_waits_for_it():
    spec = RunSpec.model_validate({"seed": 3})
    old, new = (wide_weights(spec, BOX4, DISCRETE2, seed) for seed in (1, 2))
    core = ActingCore.build(spec, BOX4, DISCRETE2, weights=old, version=1, backend="onnxruntime")
    reference = ActingCore.build(spec, BOX4, DISCRETE2, weights=new, version=2)
    BOX4.seed(0)
    batch = np.stack([BOX4.sample() for _ in range(256)])
    made = [SingleAgentEpisode(observation_space=BOX4) for _ in range(256)]
    for episode, obs in zip(made, batch, strict=True):
        episode.add_env_reset(obs)
    before = core.act(made, False, batch)[Columns.ACTIONS].copy()

    held = threading.Event()
    core.onnx._worker.submit(held.wait, 10)  # the binding thread is busy: the new session cannot be built yet
    rebinding = core.set_weights(2, new)
    for _ in range(3):  # batches go on with version 1's session meanwhile
        core.take_rebound()  # (not built yet: nothing to take)
        outputs = core.act(made, False, batch)
        assert core.version == 1 and set(outputs[Columns.MODEL_VERSION]) == {1}
        np.testing.assert_array_equal(outputs[Columns.ACTIONS], before)
    held.set()
    rebinding.result(timeout=10)  # the session is built in milliseconds
    core.take_rebound()
    outputs = core.act(made, False, batch)
    assert core.version == 2 and set(outputs[Columns.MODEL_VERSION]) == {2}
    np.testing.assert_array_equal(outputs[Columns.ACTIONS], reference.act(made, False, batch)[Columns.ACTIONS])
    assert not np.array_equal(outputs[Columns.ACTIONS], before)


def test_a_multi_agent_run_is_refused_by_the_onnxruntime_backend():
    spec = RunSpec.model_validate({"multi_agent": {"policy_mapping_fn": "shared"}})
    spaces = gym.spaces.Dict({"a": BOX4}), gym.spaces.Dict({"a": DISCRETE2})
    with pytest.raises(SpecError, match="--backend onnxruntime serves single-agent runs"):
        ActingCore.build(spec, *spaces, backend="onnxruntime")


def test_dqn_is_refused_by_the_onnxruntime_backend_and_auto_acts_with_torch_for_dqn_and_sac():
    """DQN's module explores by itself (epsilon-greedy from torch's generator): no graph serves it. `auto` takes
    onnxruntime for the default actor-critic only, so DQN and SAC runs act in torch."""
    dqn = RunSpec.model_validate({"algorithm": {"name": "DQN"}})
    with pytest.raises(SpecError, match=r"^--backend onnxruntime: .*DQN's epsilon-greedy.*--backend torch"):
        ActingCore.build(dqn, BOX4, DISCRETE2, backend="onnxruntime")
    for name in ("DQN", "SAC"):
        core = ActingCore.build(RunSpec.model_validate({"algorithm": {"name": name}}), BOX4, DISCRETE2, backend="auto")
        assert core.onnx is None


async def test_a_server_with_the_onnxruntime_backend_records_what_a_torch_server_records(server_factory, tmp_path):
    """Two servers of one seeded spec and --seed, one per backend, the same 40 exploring steps of 4 sub-envs: the
    same actions, log-probabilities and distribution inputs in their episode files."""
    spec = RunSpec.model_validate({"seed": 3, "sampling": {"rollout_fragment_length": 16}})
    recorded = {}
    for backend in ("torch", "onnxruntime"):
        folder = tmp_path / backend
        server = await server_factory(spec=spec, backend=backend, episode_dir=folder)
        stream = RawStream(server)
        await stream.send(hello(num_envs=4))
        await stream.recv()
        rng = np.random.default_rng(0)
        for t in range(40):
            done = np.full(4, t % 10 == 9)
            await stream.send(step(rng.uniform(-1, 1, (4, 4)).astype(np.float32), 4, np.ones(4), done))
            await stream.recv()
        await stream.channel.close()
        await server.stop()
        chunks = [episode_from_proto(message) for message in shipped(folder)]
        recorded[backend] = sorted(chunks, key=lambda chunk: (chunk.get_observations(0).tobytes(), len(chunk)))
    assert len(recorded["torch"]) == len(recorded["onnxruntime"]) > 4
    for a, b in zip(recorded["torch"], recorded["onnxruntime"], strict=True):
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        for key in (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS):
            np.testing.assert_allclose(a.get_extra_model_outputs(key), b.get_extra_model_outputs(key), atol=1e-5)


def test_without_onnxruntime_auto_acts_with_torch_and_onnxruntime_is_refused(monkeypatch, caplog):
    """An install without onnx and onnxruntime (the backend's module cannot be imported): `auto` acts in torch and
    says why; `--backend onnxruntime` is refused with what to install."""
    spec = RunSpec()
    assert ActingCore.build(spec, BOX4, DISCRETE2, backend="auto").onnx is not None  # with them: onnxruntime
    monkeypatch.setitem(sys.modules, "rlgate.export.serving", None)  # import then raises ImportError
    with caplog.at_level(logging.WARNING, logger="rlgate.policy.acting"):
        assert ActingCore.build(spec, BOX4, DISCRETE2, backend="auto").onnx is None
    assert "forward pass in torch: --backend onnxruntime" in caplog.text
    with pytest.raises(SpecError, match=r"^--backend onnxruntime: .*install onnx and onnxruntime"):
        ActingCore.build(spec, BOX4, DISCRETE2, backend="onnxruntime")
