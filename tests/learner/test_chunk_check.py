"""Chunks that decode but do not fit the run's spaces or model are refused at intake: each would fail the
update that batches it (and with it every other server's steps there), or be trained on meaning nothing."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from support.batches import episode_batch
from support.intakes import accept

from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.episodes import InfiniteLookbackBuffer, SingleAgentEpisode
from rlgate.learner.batch_decoder import BatchDecoder
from rlgate.learner.chunk_check import learner_output_shapes
from rlgate.learner.intake import Intake
from rlgate.models import ModelConfig, build_module
from rlgate.models.outputs import output_shapes
from rlgate.v1 import learner_pb2

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space
ACTION_SPACE = gym.spaces.Discrete(2)


def actions(value: float, dtype: type = np.int64):
    def change(chunk: SingleAgentEpisode) -> None:
        chunk.actions.data = np.full(chunk.actions.len_incl_lookback(), value, dtype)

    return change


def observations_of_width(width: int):
    def change(chunk: SingleAgentEpisode) -> None:
        chunk.observations.data = np.zeros((chunk.observations.len_incl_lookback(), width), np.float32)

    return change


def dist_inputs_of_width(width: int):
    def change(chunk: SingleAgentEpisode) -> None:
        rows = chunk.extra_model_outputs[Columns.ACTION_DIST_INPUTS].len_incl_lookback()
        chunk.extra_model_outputs[Columns.ACTION_DIST_INPUTS].data = np.zeros((rows, width), np.float32)

    return change


def no_model_outputs(chunk: SingleAgentEpisode) -> None:
    chunk.extra_model_outputs.clear()


def logp_per_action(chunk: SingleAgentEpisode) -> None:
    rows = chunk.actions.len_incl_lookback()
    chunk.extra_model_outputs[Columns.ACTION_LOGP] = InfiniteLookbackBuffer(
        np.zeros((rows, 2), np.float32), chunk.actions.lookback
    )


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (actions(5), "actions not of the action space"),
        (actions(-1), "actions not of the action space"),
        (actions(0.5, np.float32), "actions not of the action space"),
        (observations_of_width(3), "observations not of the observation space"),
        (dist_inputs_of_width(7), "action_dist_inputs of another shape"),
        (logp_per_action, "action_logp of another shape"),
        (no_model_outputs, "no action_logp"),
    ],
)
def test_a_chunk_that_does_not_fit_is_refused_and_the_rest_of_its_batch_taken(
    tmp_path, cartpole_chunks, change, reason, tables
):
    good, bad, later = cartpole_chunks(60)[:3]
    change(bad)
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    shapes = {None: learner_output_shapes(module, "PPO")}
    intake = Intake(tmp_path, BatchDecoder([OBSERVATION_SPACE], ACTION_SPACE, output_shapes=shapes))
    ack = accept(intake, episode_batch([good, bad, later], tables=tables))
    assert (ack.accepted, ack.rejected) == (2, 1)
    assert intake.rejected == {reason: 1}
    assert [chunk.id_ for chunk in intake.pending] == [good.id_, later.id_]


def wire_column(name: str, dtype: type, width: int | None = None):
    """The first chunk's column `name` (rewards, model_versions, an extra model output) cast to `dtype` (and each
    row repeated `width` times across, if given) in the batch as sent: its encoder makes the columns' dtypes right."""

    def change(batch: learner_pb2.EpisodeBatch) -> None:
        chunk = batch.chunks[0] if batch.chunks else batch.episodes[0]
        tensor = (
            getattr(chunk, name) if name in ("rewards", "model_versions") else chunk.extra_model_outputs[name].tensor
        )
        column = codec.from_tensor(tensor)
        if width is not None:
            column = np.repeat(column[:, None], width, axis=1)
        tensor.CopyFrom(codec.to_tensor(column.astype(dtype)))

    return change


def without(name: str):
    """The first chunk's `model_versions` or extra model output `name` left out of the batch as sent."""

    def change(batch: learner_pb2.EpisodeBatch) -> None:
        chunk = batch.chunks[0] if batch.chunks else batch.episodes[0]
        if name == "model_versions":
            chunk.ClearField(name)
        else:
            del chunk.extra_model_outputs[name]

    return change


def with_output(name: str):
    """An extra model output `name` added to the first chunk (its rewards' copy: one float per step)."""

    def change(batch: learner_pb2.EpisodeBatch) -> None:
        chunk = batch.chunks[0] if batch.chunks else batch.episodes[0]
        chunk.extra_model_outputs[name].tensor.CopyFrom(chunk.rewards)

    return change


# Found by fuzzing the intake: each passed it and failed the update (unsigned and bool tensors do not subtract in
# torch, a version per step of two columns broadcast into a mask of rows x rows, a column the others lack), or
# trained quietly on integers.
@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (wire_column("model_versions", np.uint32), "model_version of another dtype"),
        (wire_column("model_versions", np.float64), "model_version of another dtype"),
        (wire_column("model_versions", np.int64, 2), "model_version of another shape"),
        (wire_column(Columns.ACTION_LOGP, np.bool_), "action_logp of another dtype"),
        (wire_column(Columns.ACTION_LOGP, np.int32), "action_logp of another dtype"),
        (wire_column(Columns.ACTION_DIST_INPUTS, np.uint64), "action_dist_inputs of another dtype"),
        (wire_column("rewards", np.int8), "rewards of another dtype"),
        # A column the chunks batched with it have (or lack): the update's columns do not add up.
        (without("model_versions"), "no model_version"),
        (without(Columns.ACTION_DIST_INPUTS), "no action_dist_inputs"),
        (with_output("anything"), "unknown model outputs"),
    ],
)
def test_a_chunk_whose_columns_have_other_dtypes_is_refused_and_the_next_batch_taken(
    tmp_path, cartpole_chunks, change, reason, tables
):
    bad, *good = cartpole_chunks(60)[:3]
    module = build_module(OBSERVATION_SPACE, ACTION_SPACE)
    shapes = {None: learner_output_shapes(module, "PPO")}
    intake = Intake(tmp_path, BatchDecoder([OBSERVATION_SPACE], ACTION_SPACE, output_shapes=shapes))
    batch = episode_batch([bad], tables=tables)
    change(batch)
    ack = accept(intake, batch)
    assert (ack.accepted, ack.rejected) == (0, 1)
    assert intake.rejected == {reason: 1}
    assert accept(intake, episode_batch(good, seq=2, tables=tables)).accepted == 2


@pytest.mark.parametrize(
    ("action_space", "config", "expected"),
    [
        (ACTION_SPACE, ModelConfig(), {Columns.ACTION_DIST_INPUTS: (2,)}),
        (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), ModelConfig(), {Columns.ACTION_DIST_INPUTS: (6,)}),
        (ACTION_SPACE, ModelConfig(use_lstm=True), {}),  # its forward takes a state: not checked
    ],
)
def test_the_outputs_chunks_must_hold_are_the_learners_own_modules(action_space, config, expected):
    assert output_shapes(build_module(OBSERVATION_SPACE, action_space, config)) == expected


def test_a_multi_agent_chunk_is_held_to_its_own_modules_outputs(tmp_path, cartpole_chunks):
    """Module m1 acts in a 3-action space: its distribution inputs are 3 wide, m0's 2. A chunk of m1's with the
    width m0's module makes is refused."""
    chunks = cartpole_chunks(60)[:3]
    for chunk, module in zip(chunks, ("m0", "m1", "m1"), strict=True):
        chunk.agent_id, chunk.module_id = "a0", module
    dist_inputs_of_width(3)(chunks[1])
    three = gym.spaces.Discrete(3)
    spaces = {"m0": (OBSERVATION_SPACE, ACTION_SPACE), "m1": (OBSERVATION_SPACE, three)}
    shapes = {m: learner_output_shapes(build_module(OBSERVATION_SPACE, spaces[m][1]), "PPO") for m in spaces}
    decoder = BatchDecoder([], ACTION_SPACE, module_spaces=spaces, agents=frozenset({"a0"}), output_shapes=shapes)
    intake = Intake(tmp_path, decoder)
    ack = accept(intake, episode_batch(chunks))
    assert (ack.accepted, ack.rejected) == (2, 1)
    assert intake.rejected == {"action_dist_inputs of another shape": 1}
    assert [chunk.id_ for chunk in intake.pending] == [chunks[0].id_, chunks[1].id_]
