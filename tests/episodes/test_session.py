"""The column-wise Session ships exactly the episodes per-step SingleAgentEpisode recording would.

Random message sequences (sub-envs ending at random, flushes before and after the forward, chunk cuts
with lookback, nested observations and states, infos, sessions closed mid-step) go through the server's
`Session` and through `ReferenceSession` (one SingleAgentEpisode per sub-env, add_env_step and cut);
every shipped chunk, decoded as the learner decodes it, must match field by field, and a flush ships
exactly the steps `unshipped_steps()` said were held. Then both drive real policies whose pipelines use
the per-episode path (an LSTM's states) and the batched write-back (Dict observations flattened and
normalised), and must give the same actions and episodes.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.chunks import decoded
from support.reference_session import ReferenceSession

from rlgate.connectors import ConnectorV2
from rlgate.connectors.env_to_module import ObservationPreprocessor
from rlgate.core.columns import Columns
from rlgate.core.tree import batch, map_structure
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.session import Session, SessionSpec
from rlgate.models import ModelConfig
from rlgate.policy.acting import ActingCore
from rlgate.spec.run import RunSpec

BOX = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
DICT = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": gym.spaces.Discrete(3)})
ACTIONS = gym.spaces.Discrete(2)


def assert_same_buffer(expected: Any, actual: Any, name: str) -> None:
    assert actual.lookback == expected.lookback, f"{name}: lookback {actual.lookback} != {expected.lookback}"
    assert actual.len_incl_lookback() == expected.len_incl_lookback(), name
    if not expected.len_incl_lookback():
        return
    want = expected.data if expected.finalized else batch(expected.data)
    got = actual.data if actual.finalized else batch(actual.data)
    map_structure(lambda w, g: np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name), want, got)


def assert_same_episode(expected: SingleAgentEpisode, actual: SingleAgentEpisode) -> None:
    """Same steps, lookback, flags, outputs and infos (ids compared by the caller)."""
    header = ("len", "t_started", "t", "chunk_index", "is_terminated", "is_truncated", "session_closed")
    assert {k: getattr(actual, k) if k != "len" else len(actual) for k in header} == {
        k: getattr(expected, k) if k != "len" else len(expected) for k in header
    }
    assert_same_buffer(expected.observations, actual.observations, "observations")
    assert_same_buffer(expected.actions, actual.actions, "actions")
    assert_same_buffer(expected.rewards, actual.rewards, "rewards")
    assert actual.infos.data == expected.infos.data and actual.infos.lookback == expected.infos.lookback
    assert sorted(actual.extra_model_outputs) == sorted(expected.extra_model_outputs)
    for key, buffer in expected.extra_model_outputs.items():
        assert_same_buffer(buffer, actual.extra_model_outputs[key], key)


class Twins:
    """A Session and a ReferenceSession fed the same messages; every shipment is compared."""

    def __init__(self, spec: SessionSpec, fragment: int, lookback: int) -> None:
        self.new = Session(spec, rollout_fragment_length=fragment, lookback=lookback)
        self.ref = ReferenceSession(spec, rollout_fragment_length=fragment, lookback=lookback)
        self.ids: dict[str, str] = {}  # reference id -> session id
        self.shipped = 0

    def compare(self, expected: list[SingleAgentEpisode], shipped: list[Chunk]) -> list[SingleAgentEpisode]:
        """Check the session's chunks against the reference's episodes; return them decoded."""
        actual = decoded(shipped)
        assert len(actual) == len(expected)
        for want, got in zip(expected, actual, strict=True):
            assert self.ids.setdefault(want.id_, got.id_) == got.id_, "chunks of one episode must share its id"
            assert_same_episode(want, got)
        assert len(set(self.ids.values())) == len(self.ids), "distinct episodes must have distinct ids"
        self.shipped += len(actual)
        return actual

    def observe(self, *message: Any) -> tuple[Any, Any, int]:
        ref_episodes, ref_steps = self.ref.observe(*message)
        rows, steps = self.new.observe(*message)
        assert steps == ref_steps
        self.new.unshipped_steps()  # kept until the session changes: flush() below checks it was let go
        return ref_episodes, rows, steps

    def record(self, outputs: dict[str, Any]) -> None:
        self.compare(self.ref.record(outputs), self.new.record(outputs))
        self.new.unshipped_steps()

    def flush(self) -> list[SingleAgentEpisode]:
        unshipped = self.new.unshipped_steps()  # what the learner link counts as held in running episodes
        shipped = self.new.flush()
        assert sum(chunk.steps for chunk in shipped) == unshipped and self.new.unshipped_steps() == 0
        return self.compare(self.ref.flush(), shipped)

    def close(self) -> None:
        self.compare(self.ref.close(), self.new.close())


def random_obs(rng: np.random.Generator, space: gym.Space, n: int) -> Any:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, n)
    if isinstance(space, gym.spaces.Dict):
        return {"pos": rng.uniform(-1, 1, (n, 2)).astype(np.float32), "mode": rng.integers(0, 3, n)}
    return rng.standard_normal((n, 4)).astype(np.float32)


def random_outputs(rng: np.random.Generator, n: int, stateful: bool, explore: bool) -> dict[str, Any]:
    outputs = {
        Columns.ACTIONS: rng.integers(0, 2, n),
        Columns.ACTIONS_FOR_ENV: rng.integers(0, 2, n),
        Columns.ACTION_DIST_INPUTS: rng.standard_normal((n, 2)).astype(np.float32),
        Columns.VF_PREDS: rng.standard_normal(n).astype(np.float32),
        Columns.MODEL_VERSION: np.full(n, rng.integers(0, 5), np.int64),
    }
    if explore:
        outputs[Columns.ACTION_LOGP] = rng.standard_normal(n).astype(np.float32)
    if stateful:
        outputs[Columns.STATE_OUT] = {"h": rng.standard_normal((n, 3)).astype(np.float32)}
    return outputs


@pytest.mark.parametrize("seed", range(60))
def test_session_ships_what_per_step_episodes_would(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    space = DICT if seed % 3 == 0 else BOX
    stateful, explore, with_infos = seed % 4 == 1, seed % 5 != 0, seed % 2 == 0
    spec = SessionSpec("test", space, ACTIONS, n, explore)
    twins = Twins(spec, fragment=int(rng.integers(1, 8)), lookback=int(rng.integers(0, 4)))
    end_prob = float(rng.choice([0.02, 0.1, 0.3]))
    steps = 0
    for message in range(int(rng.integers(1, 120))):
        infos = [{"message": message, "env": i} for i in range(n)] if with_infos else None
        rewards = rng.standard_normal(n).astype(np.float32 if message % 2 else np.float64)
        ends = rng.random((2, n)) < end_prob
        _, _, appended = twins.observe(random_obs(rng, space, n), rewards, ends[0], ends[1], infos)
        steps += appended
        if rng.random() < 0.1:
            twins.flush()  # while the step's actions are being computed (the batcher's paused flush)
        if rng.random() < 0.05:
            twins.close()  # the client went away mid-step
            return
        twins.record(random_outputs(rng, n, stateful, explore))
        if rng.random() < 0.1:
            twins.flush()
    twins.close()
    assert steps == 0 or twins.shipped > 0


def test_session_table_stays_bounded_on_a_never_ending_env() -> None:
    """Rows no chunk needs are dropped: the table's size follows the fragment length, not the session's age."""
    session = Session(SessionSpec("test", BOX, ACTIONS, 8, True), rollout_fragment_length=20, lookback=2)
    rng = np.random.default_rng(0)
    never = np.zeros(8, bool)
    shipped = 0
    for _ in range(2_000):
        session.observe(random_obs(rng, BOX, 8), np.ones(8), never, never, None)
        shipped += len(session.record(random_outputs(rng, 8, False, True)))
    assert shipped == 8 * (1_999 // 20)
    assert session._table.capacity <= 128, session._table.capacity


def test_a_session_with_nowhere_to_ship_builds_no_chunks_and_stays_bounded() -> None:
    """A server without a learner or episode files: episodes are still cut (so the table stays bounded) and
    the sub-envs' episodes as the pipeline sees them are the same, but no chunk is built."""
    spec = SessionSpec("test", BOX, ACTIONS, 8, True)
    shipping, silent = (Session(spec, rollout_fragment_length=20, lookback=2, ships=ships) for ships in (True, False))
    rng = np.random.default_rng(0)
    shipped = 0
    for _ in range(1_000):
        obs, ends = random_obs(rng, BOX, 8), rng.random((2, 8)) < 0.02
        rows = [session.observe(obs, np.ones(8), ends[0], ends[1], None)[0] for session in (shipping, silent)]
        assert [len(episode) for episode in rows[0]] == [len(episode) for episode in rows[1]]
        outputs = random_outputs(rng, 8, False, True)
        shipped += len(shipping.record(outputs))
        assert silent.record(outputs) == [] and silent.unshipped_steps() == shipping.unshipped_steps()
    assert shipped > 100 and silent.flush() == [] and silent.close() == []
    assert silent._table.capacity == shipping._table.capacity <= 128


class NegateObservations(ConnectorV2):
    """A per-episode piece in RLlib's style: writes each episode's new latest observation itself."""

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: Any, **kwargs: Any) -> dict[str, Any]:
        for episode in episodes:
            episode.set_observations(new_data=-episode.get_observations(-1), at_indices=-1)
        return batch


class OneHotEach(ObservationPreprocessor):
    """A per-episode piece (it iterates the episodes) that changes the observations' shape: Discrete(5) -> Box(5)."""

    def recompute_output_observation_space(self, input_observation_space: Any, input_action_space: Any) -> Any:
        return gym.spaces.Box(0.0, 1.0, (5,), np.float32)

    def preprocess(self, observation: Any, episode: Any) -> Any:
        assert len(episode.get_observations()) == len(episode) + 1  # the episode built around the raw newest one
        return np.eye(5, dtype=np.float32)[int(observation)]


def policy_spec(model: ModelConfig | None, mean_std: bool) -> RunSpec:
    pieces = ["MeanStdFilter"] if mean_std else []
    return RunSpec.parse(
        {"model": {"config": model.to_dict() if model else {}}, "connectors": {"env_to_module": pieces}, "seed": 0},
        "test",
    )


def run_policies(
    space: gym.Space, model: ModelConfig | None, mean_std: bool, first_piece: ConnectorV2 | None = None
) -> None:
    """Drive a Session and a ReferenceSession through two identical policies; compare actions and episodes."""
    n, messages = 4, 60
    policies = [ActingCore.build(policy_spec(model, mean_std), space, ACTIONS, seed=0) for _ in range(2)]
    if first_piece is not None:
        for policy in policies:
            policy.env_to_module.prepend(first_piece)
    twins = Twins(SessionSpec("test", space, ACTIONS, n, False), fragment=7, lookback=2)
    rng = np.random.default_rng(1)
    for _ in range(messages):
        ends = rng.random((2, n)) < 0.08
        ref_episodes, rows, _ = twins.observe(random_obs(rng, space, n), rng.standard_normal(n), *ends, None)
        for chunk in twins.flush() if rng.random() < 0.2 else []:  # paused while this step waits
            # Its observations are not written back yet (flattened, normalised): none of them may ship.
            assert twins.new.observation_space.contains(chunk.get_observations(-1)), "a raw observation shipped"
        obs = twins.new._pending._latest  # the message's observations, as the batcher passes them
        expected = policies[0].act(ref_episodes, False, map_structure(np.copy, obs))
        actual = policies[1].act(rows, False, obs)
        assert sorted(actual) == sorted(expected)
        map_structure(np.testing.assert_array_equal, actual, expected)
        twins.record(actual)
        if rng.random() < 0.1:
            twins.flush()
    twins.close()
    assert twins.shipped > 0


def test_stateful_module_reads_states_from_built_episodes() -> None:
    """An LSTM's STATE_IN comes from the episodes (the per-episode path): built from the table, same states,
    after the batched write-back of flattened, normalised Dict observations."""
    run_policies(DICT, ModelConfig(use_lstm=True, lstm_cell_size=8, fcnet_hiddens=(8,)), mean_std=True)


def test_a_per_episode_piece_sees_written_back_history_and_the_newest_observation_as_sent() -> None:
    """Earlier steps hold the one-hot vectors the piece wrote back, the newest is still the Discrete int:
    the episode it reads is built in list mode (RLlib's), not concatenated into one array."""
    run_policies(gym.spaces.Discrete(5), None, mean_std=False, first_piece=OneHotEach())


def test_per_episode_write_back_reaches_the_shipped_episodes() -> None:
    """A piece that sets each episode's latest observation itself (RLlib style) works on built episodes, and
    a batched write-back after it (MeanStdFilter) replaces what it wrote."""
    run_policies(BOX, None, mean_std=True, first_piece=NegateObservations())


def test_observation_write_back_is_batched_and_shipped() -> None:
    """Dict observations are flattened and normalised by the pipeline; the episodes keep what the module saw."""
    run_policies(DICT, None, mean_std=True)
