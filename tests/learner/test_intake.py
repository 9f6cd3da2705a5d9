"""Episode intake: de-duplication by (episode id, chunk index), and intake files that outlive the process."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from support.batches import episode_batch as batch
from support.intakes import accept

from rlgate.core import codec
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_to_proto
from rlgate.learner.batch_decoder import BatchDecoder, chunk_key
from rlgate.learner.intake import Intake

OBSERVATION_SPACE = gym.make("CartPole-v1").observation_space
ACTION_SPACE = gym.spaces.Discrete(2)


DECODER = BatchDecoder([OBSERVATION_SPACE], ACTION_SPACE)


def keys(chunks: list[SingleAgentEpisode]) -> list[str]:
    return [chunk_key(c.id_, c.chunk_index) for c in chunks]


def intake_at(directory: Path, trained: set[str] | None = None) -> Intake:
    return Intake(directory, DECODER, trained=trained or set())


@pytest.fixture
def two_batches(cartpole_chunks) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode]]:
    chunks = cartpole_chunks(160)
    half = len(chunks) // 2
    return chunks[:half], chunks[half:]


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_a_batch_sent_twice_is_acknowledged_twice_and_kept_once(tmp_path, cartpole_chunks, tables):
    chunks = cartpole_chunks(100)
    # Long episodes were cut: chunks of one episode share its id and differ by chunk index.
    assert any(c.chunk_index > 0 for c in chunks)
    intake = intake_at(tmp_path)
    first = accept(intake, batch(chunks, seq=5, tables=tables))
    assert (first.seq, first.accepted, first.duplicates) == (5, len(chunks), 0)
    again = accept(intake, batch(chunks, seq=6, tables=tables))  # the server re-sends after a lost ack
    assert (again.seq, again.accepted, again.duplicates) == (6, 0, len(chunks))
    assert intake.duplicates == len(chunks)
    assert keys(intake.pending) == keys(chunks)
    assert intake.pending_steps == sum(len(c) for c in chunks)
    assert len(list(tmp_path.glob("*.pb"))) == 1  # nothing new was stored for the duplicate batch


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_a_batch_that_overlaps_an_earlier_one_adds_only_its_new_chunks(tmp_path, two_batches, tables):
    old, new = two_batches
    intake = intake_at(tmp_path)
    accept(intake, batch(old, seq=0, tables=tables))
    ack = accept(intake, batch(old[-1:] + new, seq=1, tables=tables))
    assert (ack.accepted, ack.duplicates) == (len(new), 1)
    assert keys(intake.pending) == keys(old + new)


def test_returns_add_up_over_the_chunks_of_an_episode(tmp_path, cartpole_chunks):
    chunks = cartpole_chunks(200)
    intake = intake_at(tmp_path)
    accept(intake, batch(chunks, seq=0))
    totals: dict[str, float] = {}
    finished = []
    for chunk in chunks:  # in shipping order: an episode's chunks come in chunk-index order
        totals[chunk.id_] = totals.get(chunk.id_, 0.0) + chunk.get_return()
        if chunk.is_done:
            finished.append(totals[chunk.id_])
    assert intake.episodes_finished == len(finished) > 0
    assert list(intake.returns) == finished[-len(intake.returns) :]


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_intake_files_survive_a_restart_and_reload_all_but_the_trained_chunks(tmp_path, two_batches, tables):
    trained, untrained = two_batches
    before = intake_at(tmp_path)
    accept(before, batch(trained, seq=0, tables=tables))
    accept(before, batch(untrained, seq=1, tables=tables))
    # The learner dies; its last checkpoint covered the first batch's chunks.
    after = intake_at(tmp_path, trained=set(keys(trained)))
    assert keys(after.pending) == keys(untrained)
    assert after.pending_steps == sum(len(c) for c in untrained)
    assert [episode_to_proto(e) for e in after.pending] == [episode_to_proto(c) for c in untrained]
    assert after.duplicates == len(trained)
    # A server that re-sends either batch now is answered with duplicates only.
    ack = accept(after, batch(trained + untrained, seq=2, tables=tables))
    assert (ack.accepted, ack.duplicates) == (0, len(trained) + len(untrained))


def test_a_checkpoint_deletes_exactly_the_intake_files_of_trained_chunks(tmp_path, two_batches):
    trained, untrained = two_batches
    intake = intake_at(tmp_path)
    accept(intake, batch(trained, seq=0))
    steps = sum(len(c) for c in trained)
    assert keys(intake.take(steps)) == keys(trained) and intake.pending_steps == 0
    accept(intake, batch(untrained, seq=1))  # arrives while the update runs
    covered = intake.checkpoint_state()
    assert covered.trained == sorted(keys(trained)) and covered.partial == {} and len(covered.files) == 1
    intake.checkpointed(covered)
    assert not covered.files[0].exists() and len(list(tmp_path.glob("*.pb"))) == 1
    restarted = intake_at(tmp_path, trained=set(covered.trained))
    assert keys(restarted.pending) == keys(untrained) and restarted.duplicates == 0


def test_an_intake_that_does_not_resume_sets_earlier_files_aside_unread(tmp_path, two_batches):
    first, second = two_batches
    earlier = intake_at(tmp_path)
    accept(earlier, batch(first, seq=0))
    (written,) = tmp_path.glob("*.pb")
    data = written.read_bytes()
    fresh = Intake(tmp_path, DECODER, resume=False)
    assert not fresh.pending and fresh.pending_steps == 0
    (aside,) = tmp_path.glob("set-aside-*/*.pb")  # kept, not deleted
    assert aside.read_bytes() == data
    accept(fresh, batch(second, seq=0))
    # Resuming later reads the fresh run's files only.
    assert keys(intake_at(tmp_path).pending) == keys(second)


def test_an_intake_file_that_does_not_decode_is_set_aside_and_the_rest_resume(tmp_path, two_batches):
    """The learner starts (with a warning) instead of failing on a file no learner wrote; nothing is deleted."""
    first, _ = two_batches
    accept(intake_at(tmp_path), batch(first, seq=0))
    junk = tmp_path / "00000000000000000001-deadbeef.pb"
    junk.write_bytes(b"\xff junk")
    assert keys(intake_at(tmp_path).pending) == keys(first)
    assert not junk.exists() and junk.with_name(f"{junk.name}.unreadable").read_bytes() == b"\xff junk"


def test_a_stored_batch_that_fails_when_read_back_is_set_aside_not_lost(tmp_path, two_batches):
    """A batch taken (and acknowledged) once that the intake's code fails on at start-up (here its step count): its
    file is kept aside, unread, and the learner resumes the rest, instead of deleting it at the next checkpoint."""
    first, second = two_batches
    earlier = intake_at(tmp_path)
    accept(earlier, batch(first, seq=0))
    accept(earlier, batch(second, seq=1))
    stored = sorted(tmp_path.glob("*.pb"))
    doomed = set(keys(second))

    def count(episodes: list[SingleAgentEpisode]) -> int:
        if doomed & set(keys(episodes)):
            raise RuntimeError("a bug in counting")
        return sum(map(len, episodes))

    resumed = Intake(tmp_path, DECODER, count=count)
    assert keys(resumed.pending) == keys(first)
    assert resumed.rejected.total() == 0  # nothing counted as refused: it was taken once, and is kept
    assert stored[0].exists() and not stored[1].exists()
    assert stored[1].with_name(f"{stored[1].name}.unreadable").exists()


def test_a_batch_says_which_known_space_its_observations_are_in(tmp_path, cartpole_chunks):
    """Observations stay as the servers' write-back pieces left them (a FrameStacking module input is never
    written back); the intake decodes with the space the batch names, if it is one it knows."""
    chunks = cartpole_chunks(40)
    stacked = gym.spaces.Box(-1.0, 1.0, (12,), np.float32)  # e.g. the module's input after frame stacking
    intake = Intake(tmp_path, BatchDecoder([stacked, OBSERVATION_SPACE], ACTION_SPACE))
    named = batch(chunks, seq=1)
    named.observation_space.CopyFrom(codec.space_to_proto(OBSERVATION_SPACE))
    assert accept(intake, named).accepted == len(chunks)
    assert all(episode.observation_space == OBSERVATION_SPACE for episode in intake.pending)
    strangers = cartpole_chunks(40, seed=1)
    foreign = batch(strangers, seq=2)
    foreign.observation_space.CopyFrom(codec.space_to_proto(gym.spaces.Box(-1.0, 1.0, (7,), np.float32)))
    ack = accept(intake, foreign)
    assert ack.accepted == 0 and ack.rejected == len(strangers)


def test_an_update_takes_exactly_its_steps_oldest_first_splitting_the_last_chunk(tmp_path, cartpole_chunks):
    chunks = [c for c in cartpole_chunks(200) if len(c) > 3]
    intake = intake_at(tmp_path)
    accept(intake, batch(chunks, seq=0))
    total = intake.pending_steps
    want = len(chunks[0]) + len(chunks[1]) // 2  # ends inside the second chunk
    taken = intake.take(want)
    assert sum(len(c) for c in taken) == want and intake.pending_steps == total - want
    assert keys(taken) == keys(chunks[:2])
    rest = intake.pending[0]  # the second chunk's remainder, first in line
    assert keys([rest]) == keys(chunks[1:2]) and len(rest) == len(chunks[1]) - len(chunks[1]) // 2
    observations = chunks[1].get_observations()
    assert (rest.get_observations(0) == observations[len(chunks[1]) // 2]).all()  # continues where the split was
    assert rest.get_observations(-1, neg_index_as_lookback=True).shape == observations[0].shape  # lookback kept


def test_a_split_chunk_goes_into_checkpoints_and_a_restart_trains_only_its_remainder(tmp_path, cartpole_chunks):
    chunks = [c for c in cartpole_chunks(100) if len(c) > 3]
    intake = intake_at(tmp_path)
    accept(intake, batch(chunks, seq=0))
    first = len(chunks[0]) // 2
    intake.take(first)
    covered = intake.checkpoint_state()
    assert covered.trained == [] and covered.files == []  # the batch file still holds untrained steps
    assert covered.partial == {chunk_key(chunks[0].id_, chunks[0].chunk_index): first}
    intake.checkpointed(covered)
    restarted = Intake(tmp_path, DECODER, trained=set(covered.trained), partial=covered.partial)
    assert len(restarted.pending[0]) == len(chunks[0]) - first
    assert restarted.pending_steps == sum(len(c) for c in chunks) - first


def test_chunks_too_stale_to_train_are_dropped_counted_and_covered_by_the_next_checkpoint(tmp_path, cartpole_chunks):
    old, new = cartpole_chunks(60, version=0), cartpole_chunks(60, version=5, seed=1)
    intake = intake_at(tmp_path)
    accept(intake, batch(old, seq=0))
    accept(intake, batch(new, seq=1))
    assert intake.drop_stale(min_version=3) == sum(len(c) for c in old)
    assert keys(intake.pending) == keys(new) and intake.pending_steps == sum(len(c) for c in new)
    covered = intake.checkpoint_state()
    # Listed as dropped, not as trained (no step of them was); their batch's file may go.
    assert (covered.trained, covered.stale, len(covered.files)) == ([], sorted(keys(old)), 1)
    intake.checkpointed(covered)
    restarted = Intake(tmp_path, DECODER, stale=set(covered.stale))
    assert accept(restarted, batch(old, seq=2)).duplicates == len(old)  # a re-sent stale chunk is not taken again
    # drop_stale skips its scan while no pending chunk can be stale: a late chunk of an old version is not missed.
    assert intake.drop_stale(min_version=3) == 0
    late = cartpole_chunks(30, version=1, seed=2)
    accept(intake, batch(late, seq=2))
    assert intake.drop_stale(min_version=3) == sum(len(c) for c in late)
    assert keys(intake.pending) == keys(new)


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_multi_agent_chunks_are_decoded_in_their_modules_spaces_and_dropped_by_their_modules_version(
    tmp_path, cartpole_chunks, tables
):
    """A multi-agent intake: each chunk is held to its own module's version; unknown agents and modules are
    refused (a chunk naming a module the learner lacks would fail the whole update)."""
    trained, frozen, strangers = cartpole_chunks(40), cartpole_chunks(40, seed=1), cartpole_chunks(20, seed=2)
    for chunks, agent, module in ((trained, "a0", "m0"), (frozen, "a1", "m1"), (strangers[:1], "a1", "m9")):
        for chunk in chunks:
            chunk.agent_id, chunk.module_id = agent, module
    strangers[1].agent_id, strangers[1].module_id = "a9", "m0"
    spaces = (OBSERVATION_SPACE, ACTION_SPACE)
    modules = {"m0": spaces, "m1": spaces}
    intake = Intake(tmp_path, BatchDecoder([], ACTION_SPACE, module_spaces=modules, agents=frozenset({"a0", "a1"})))
    ack = accept(intake, batch(trained + frozen + strangers[:2], seq=0, tables=tables))
    assert (ack.accepted, ack.rejected) == (len(trained) + len(frozen), 2)
    assert intake.rejected == {"unknown module": 1, "unknown agent": 1}
    # m0 trained to version 5 (all its chunks came from version 0), m1 never trained: only m0's chunks go.
    assert intake.drop_stale({"m0": 5 - 2, "m1": 0 - 2}) == sum(len(c) for c in trained)
    assert keys(intake.pending) == keys(frozen)


@pytest.mark.parametrize("tables", [True, False], ids=["tables", "messages"])
def test_a_single_agent_run_refuses_chunks_that_name_a_module(tmp_path, cartpole_chunks, tables):
    """A single-agent run's chunks are held to its module's outputs; one naming another module was held to
    none (no action_dist_inputs needed), and batched with the others, failed the update."""
    good, named = cartpole_chunks(40)[:2]
    named.module_id = "other"
    intake = intake_at(tmp_path)
    ack = accept(intake, batch([named], seq=0, tables=tables))
    assert (ack.accepted, ack.rejected) == (0, 1) and intake.rejected == {"unknown module": 1}
    assert accept(intake, batch([good], seq=1, tables=tables)).accepted == 1


def test_a_chunk_sent_as_a_message_and_again_in_a_table_is_a_duplicate(tmp_path, cartpole_chunks):
    """A server upgraded with batches in its spool re-sends them in the old form, then sends tables."""
    chunks = cartpole_chunks(60)
    intake = intake_at(tmp_path)
    accept(intake, batch(chunks[:5], seq=0, tables=False))
    ack = accept(intake, batch(chunks, seq=1))
    assert (ack.accepted, ack.duplicates) == (len(chunks) - 5, 5)
    assert keys(intake.pending) == keys(chunks)


@pytest.mark.parametrize(
    ("field", "change", "message"),
    [
        ("steps", lambda table: table.steps.append(1), "steps: .* entries for"),
        ("rewards", lambda table: table.rewards.CopyFrom(codec.to_tensor(np.zeros(3, np.float32))), "rewards: 3 rows"),
        ("observations", lambda table: table.observations.tensor.shape.__setitem__(0, 1), "observations"),
        ("infos", lambda table: table.infos.add(), "infos: 1 for"),
        ("agent_ids", lambda table: table.agent_ids.append("a0"), "agent_ids: 1 entries"),
        # The chunks' buffers find their length in a column's first array: an empty tuple first failed the intake
        # with an IndexError, and the stream with it (the server's spool would send the batch again for ever).
        (
            "actions",
            lambda table: table.actions.CopyFrom(
                codec.to_value(({"a": codec.from_value(table.actions)}, ()))  # rows, then nothing
            ),
            r"actions: an empty dict or tuple, which holds no rows",
        ),
    ],
)
def test_a_table_whose_rows_do_not_add_up_is_rejected_whole_and_the_rest_of_its_batch_taken(
    tmp_path, cartpole_chunks, field, change, message, caplog
):
    """A table's chunks cannot be told apart when its columns and lengths disagree: all are rejected (counted
    and logged), and the batch's other tables and messages are still taken."""
    good, bad, single = cartpole_chunks(40, seed=1), cartpole_chunks(40, seed=2), cartpole_chunks(10, seed=3)[:1]
    sent = batch(good, seq=0)
    broken = batch(bad, seq=0).chunks[0]
    change(broken)
    sent.chunks.append(broken)
    sent.episodes.extend(batch(single, seq=0, tables=False).episodes)
    intake = intake_at(tmp_path)
    ack = accept(intake, sent)
    assert (ack.accepted, ack.rejected) == (len(good) + 1, len(bad))
    assert intake.rejected == {"malformed": len(bad)}
    assert keys(intake.pending) == keys(single + good)  # messages first, then the tables
    assert re.search(message, caplog.text), caplog.text
