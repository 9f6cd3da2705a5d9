"""A multi-agent run's episode figures as RLlib 2.60 reports them: per multi-agent episode, the sum of all its
agents' returns (episode_return_mean), its env steps (episode_len_mean), and the returns of each module's agents
(module_episode_returns_mean) and of each agent (agent_episode_returns_mean), counted by the learner once every
chunk of the episode has reached it. Real PettingZoo envs and a real policy play through a real server session;
its shipped chunks go, as the server's batches, into a real learner intake (and, last, a real learner)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.chunks import decoded
from support.intakes import accept
from support.servers import SELF_PLAY

from rlgate.core.columns import Columns
from rlgate.envs.agent_envs import AgentEnvs
from rlgate.episodes.chunk import Chunk
from rlgate.episodes.chunk_codec import chunk_tables
from rlgate.learner.batch_decoder import BatchDecoder, chunk_key
from rlgate.learner.intake import RETURN_WINDOW, Intake
from rlgate.learner.main import LearnerServer
from rlgate.learner.multi_agent_returns import MultiAgentReturns
from rlgate.policy.acting import ActingCore
from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.multi_agent import spaces_by_agent
from rlgate.spec.run import RunSpec
from rlgate.v1 import learner_pb2, learner_pb2_grpc

pytestmark = pytest.mark.usefixtures("examples_importable")
pytest.importorskip("pettingzoo")

CARTPOLES = {
    "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole", "num_envs": 2},
    "multi_agent": {"policy_mapping_fn": "shared"},
}


@dataclass
class Played:
    """What a session shipped (each record()'s chunks) and, from the env's own steps, each multi-agent episode
    that ended: its id, the sum of every agent's rewards and its env steps, in the order the episodes ended;
    the session, its last episodes still running."""

    shipments: list[list[Chunk]]
    episodes: dict[str, tuple[float, int]]
    policy: ActingCore
    agents: frozenset[str]
    session: MultiAgentSession

    def chunks(self) -> list[Any]:
        return decoded([chunk for shipment in self.shipments for chunk in shipment])

    def intake(self, directory: Path, trained: set[str] | None = None) -> Intake:
        """A learner's intake for this play's modules and agents (as the learner builds it)."""
        modules = self.policy.env_to_module
        spaces = {m: (modules.observation_space[m], modules.action_space[m]) for m in modules.observation_space.spaces}
        decoder = BatchDecoder([], None, module_spaces=spaces, agents=self.agents)
        return Intake(directory, decoder, trained=trained or set(), split_chunks=False)


def play(env_factory: Any, spec: dict, rounds: int, *, fragment: int, seed: int = 0) -> Played:
    """`rounds` steps of 4 sub-envs through a MultiAgentSession cutting running episodes every `fragment` env or
    agent steps (the spec's count_steps_by). Returns what shipped and the ended episodes' true figures."""
    run_spec = RunSpec.parse(spec, "test")
    envs = AgentEnvs([env_factory() for _ in range(4)])
    policy = ActingCore.build(
        run_spec, *spaces_by_agent(envs.agent_spaces), imports=ImportPolicy(["examples"]), seed=seed
    )
    session = MultiAgentSession(
        MultiAgentSessionSpec("test", envs.agent_spaces, envs.num_envs, True),
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=fragment,
        count_steps_by=run_spec.multi_agent.count_steps_by,
        lookback=1,
        write_back=policy.write_back,
    )
    shipments: list[list[Chunk]] = []
    ended: list[tuple[float, int]] = []
    running = [[0.0, 0] for _ in range(envs.num_envs)]
    resetting = [True] * envs.num_envs
    steps = envs.reset(seed=seed)
    for _ in range(rounds):
        for i, step in enumerate(steps):  # what the session records now
            running[i] = [0.0, 0] if resetting[i] else [running[i][0] + sum(step.rewards.values()), running[i][1] + 1]
            resetting[i] = envs.done[i]
            if resetting[i]:
                ended.append((running[i][0], running[i][1]))
        episodes, _ = session.observe(steps)
        outputs = policy.act(episodes, True)
        shipments.append(session.record(outputs))
        steps = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
    envs.close()
    # The episodes in the order they ended: the order of their last chunks (those that say how many there are).
    ids = list(dict.fromkeys(c.columns.multi_agent_episode_id for s in shipments for c in s if _last(c)))
    assert len(ids) == len(ended)
    return Played(shipments, dict(zip(ids, ended, strict=True)), policy, frozenset(envs.agent_spaces), session)


def _last(chunk: Chunk) -> bool:
    return chunk.columns.multi_agent_episode_chunks > 0


def batch(chunks: list[Chunk], seq: int) -> learner_pb2.EpisodeBatch:
    """The chunks as a server's batch (learner_link: one EpisodeChunks table per module)."""
    return learner_pb2.EpisodeBatch(seq=seq, server_id="test", chunks=chunk_tables([c.columns for c in chunks]))


def batches(played: Played) -> list[learner_pb2.EpisodeBatch]:
    return [batch(chunks, seq) for seq, chunks in enumerate(played.shipments) if chunks]


def closing_order(messages: list[learner_pb2.EpisodeBatch]) -> list[str]:
    """The multi-agent episodes in the order an intake taking these batches counts them: at the last chunk of
    each that says how many it has (a batch holds a table per module, so not always the order they ended)."""
    position = {}
    for b, message in enumerate(messages):
        for t, table in enumerate(message.chunks):
            for k, (episode, total) in enumerate(
                zip(table.multi_agent_episode_ids, table.multi_agent_episode_chunks, strict=True)
            ):
                if total:
                    position[episode] = (b, t, k)
    return sorted(position, key=position.__getitem__)


def module_and_agent_returns(played: Played) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Each episode's returns per module and per agent, summed from its shipped chunks."""
    sums: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    for chunk in played.chunks():
        modules, agents = sums.setdefault(chunk.multi_agent_episode_id, ({}, {}))
        modules[chunk.module_id] = modules.get(chunk.module_id, 0.0) + chunk.get_return()
        agents[chunk.agent_id] = agents.get(chunk.agent_id, 0.0) + chunk.get_return()
    return sums


def windows(values: list[tuple[str, float]]) -> dict[str, deque[float]]:
    """(key, value) pairs as the intake keeps them: the last RETURN_WINDOW values of each key."""
    kept: dict[str, deque[float]] = {}
    for key, value in values:
        kept.setdefault(key, deque(maxlen=RETURN_WINDOW)).append(value)
    return kept


def cartpoles(**overrides: Any) -> Any:
    from examples.multi_agent_cartpole import MultiAgentCartPole

    return MultiAgentCartPole(**overrides)


@pytest.mark.parametrize("mapping", ["shared", "per_agent"])
def test_multi_agent_cartpole_counts_each_episode_once_as_both_poles_return_over_its_env_steps(tmp_path, mapping):
    """Episodes cut every 8 env steps ship as many chunks in many batches; a pole that falls first leaves
    (its agent's last chunk ships with an earlier cut). Each episode is counted once, when its last chunk is in:
    return = both agents' rewards, length = env steps; per module and per agent as RLlib sums them."""
    spec = {**CARTPOLES, "multi_agent": {"policy_mapping_fn": mapping}}
    played = play(cartpoles, spec, 250, fragment=8)
    chunks = played.chunks()
    assert len(played.episodes) >= 20
    batches_per_episode: dict[str, set[int]] = {}
    for seq, shipment in enumerate(played.shipments):
        for chunk in shipment:
            batches_per_episode.setdefault(chunk.columns.multi_agent_episode_id, set()).add(seq)
    assert max(map(len, batches_per_episode.values())) >= 3  # cut into chunks, shipped in several batches
    left_early = [  # an agent done in a chunk shipped before its episode's end
        c
        for c in chunks
        if c.is_done and not c.multi_agent_episode_chunks and c.multi_agent_episode_id in played.episodes
    ]
    assert left_early
    intake = played.intake(tmp_path)
    counted = []
    messages = batches(played)
    for message in messages:
        assert accept(intake, message).accepted == sum(len(t.ids) for t in message.chunks)
        counted += intake.take_finished()
    order = closing_order(messages)
    expected = [played.episodes[e] for e in order]
    assert counted == expected and set(order) == set(played.episodes)  # each once, when its last chunk came
    assert all(
        length > 0 and episode_return >= length for episode_return, length in expected
    )  # 2 poles: 1 to 2 per step
    assert any(episode_return > length for episode_return, length in expected)
    assert intake.episodes_finished == len(expected)
    assert list(intake.returns) == [r for r, _ in expected][-RETURN_WINDOW:]
    assert list(intake.lengths) == [n for _, n in expected][-RETURN_WINDOW:]
    sums = module_and_agent_returns(played)
    assert intake.module_returns == windows([kv for e in order for kv in sums[e][0].items()])
    assert intake.agent_returns == windows([kv for e in order for kv in sums[e][1].items()])
    assert set(intake.agent_returns) == {"agent_0", "agent_1"}
    if mapping == "shared":  # one module: its return is the episode's
        assert list(intake.module_returns["default_policy"]) == list(intake.returns)
    assert len(intake._multi_agent.open) <= 4  # nothing kept of the episodes counted: the running ones at most


def test_a_turn_based_games_module_returns_sum_each_modules_agents_per_episode(tmp_path):
    """Tic-tac-toe (AEC), "main" against itself or "random", drawn per game: an episode's return is 0 (+1 and -1,
    or a draw), a module's is its agents' summed (main in both seats: 0), each agent's its own."""
    from pettingzoo.classic import tictactoe_v3

    played = play(tictactoe_v3.env, SELF_PLAY, 200, fragment=4)
    assert len(played.episodes) >= 10
    intake = played.intake(tmp_path)
    messages = batches(played)
    for message in messages:
        accept(intake, message)
    counted, order = intake.take_finished(), closing_order(messages)
    assert counted == [played.episodes[e] for e in order] and set(order) == set(played.episodes)
    assert all(episode_return == 0 for episode_return, _ in counted)
    sums = module_and_agent_returns(played)
    assert intake.module_returns == windows([kv for e in order for kv in sums[e][0].items()])
    assert intake.agent_returns == windows([kv for e in order for kv in sums[e][1].items()])
    assert set(intake.module_returns) == {"main", "random"}
    # Games main played alone sum to 0 for it; against random, main's and random's returns cancel.
    alone = [modules for modules, _ in sums.values() if set(modules) == {"main"}]
    assert all(modules["main"] == 0 for modules in alone)
    assert any(modules.get("random") in (1.0, -1.0) for modules, _ in sums.values())


def test_re_delivered_and_reordered_chunks_count_each_episode_once(tmp_path):
    """A server re-sends every batch (its acks were lost), and a chunk comes again in another batch: duplicates,
    no episode counted twice; batches arriving in reverse order still count each episode once, whole."""
    played = play(cartpoles, CARTPOLES, 100, fragment=8)
    messages = batches(played)
    intake = played.intake(tmp_path / "again")
    for message in messages:
        accept(intake, message)
    first = intake.take_finished()
    chunks = sum(len(t.ids) for m in messages for t in m.chunks)
    for message in messages:
        accept(intake, message)
    again = [chunk for shipment in played.shipments for chunk in shipment[:1]][-2:]  # in one batch this time
    assert accept(intake, batch(again, 999)).duplicates == 2
    assert intake.take_finished() == [] and intake.duplicates == chunks + 2
    assert first == [played.episodes[e] for e in closing_order(messages)] and intake.episodes_finished == len(first)
    reordered = played.intake(tmp_path / "reversed")
    for message in reversed(messages):
        accept(reordered, message)
    assert sorted(reordered.take_finished()) == sorted(first)


def test_episodes_cut_off_as_their_client_leaves_train_but_are_not_counted(tmp_path):
    """A client that leaves truncates its running episodes, `session_closed`: they train, but they did not end in
    their env, so none is counted (RLlib counts no episode its env runner did not finish), and none stays open: their
    last chunks say how many there are. One cut just before (nothing left to ship) stays open only until `max_open`
    others are."""
    played = play(cartpoles, CARTPOLES, 100, fragment=8)
    intake = played.intake(tmp_path)
    for message in batches(played):
        accept(intake, message)
    counted = intake.episodes_finished
    intake.take_finished()
    closing = played.session.close()
    cut_off = {c.columns.multi_agent_episode_id for c in closing}
    assert cut_off and all(_last(c) and c.columns.session_closed for c in closing)
    assert all(c.columns.truncated for c in closing if not c.columns.terminated)
    ack = accept(intake, batch(closing, 1000))
    assert ack.accepted == len(closing) and intake.pending_steps  # taken, to train on
    assert intake.take_finished() == [] and intake.episodes_finished == counted
    assert len(intake._multi_agent.open) <= 4 - len(cut_off)


def test_chunks_dropped_as_stale_still_count_in_their_episode(tmp_path):
    """Chunks too stale to train on are dropped from the intake after they were counted: their episodes are
    counted whole, as RLlib's env runners report every episode they sampled."""
    played = play(cartpoles, CARTPOLES, 100, fragment=8)
    messages = batches(played)
    intake = played.intake(tmp_path)
    half = len(messages) // 2
    for message in messages[:half]:
        accept(intake, message)
    assert intake.drop_stale({"default_policy": 10**9}) > 0 and not intake.pending  # every chunk so far: version 0
    for message in messages[half:]:
        accept(intake, message)
    assert intake.take_finished() == [played.episodes[e] for e in closing_order(messages)]


def test_a_restarted_learner_counts_no_episode_twice_or_in_part(tmp_path):
    """The learner restarts after a checkpoint that covers some of the chunks: it re-reads the intake files the
    checkpoint does not cover, and the servers re-send every batch. An episode with a chunk trained before the
    restart is never counted again (nor its remainder, as an episode); every other one is counted once, whole.
    Episodes missing chunks are not kept past `max_open` others."""
    played = play(cartpoles, CARTPOLES, 120, fragment=8)
    messages = batches(played)
    before = played.intake(tmp_path)
    half = len(messages) // 2
    for message in messages[:half]:
        accept(before, message)
    counted_before = before.take_finished()
    trained = before.take(before.pending_steps // 2)  # an update took the oldest chunks, then a checkpoint
    covered = before.checkpoint_state()
    before.checkpointed(covered)
    trained_episodes = {c.multi_agent_episode_id for c in trained}
    after = played.intake(tmp_path, trained=set(covered.trained))  # reads the files left
    for message in messages:  # the servers re-send everything unacknowledged (here: everything)
        accept(after, message)
    counted_after = after.take_finished()
    assert counted_before and counted_after
    expected = [played.episodes[e] for e in closing_order(messages) if e not in trained_episodes]
    assert counted_after == expected
    assert {chunk_key(c.id_, c.chunk_index) for c in trained} <= set(covered.trained)
    running = {c.multi_agent_episode_id for c in played.chunks()} - set(played.episodes)
    lost = set(after._multi_agent.open) - running  # ended, missing the chunks trained before the restart
    assert lost and lost <= trained_episodes


def test_an_episode_whose_first_chunks_were_lost_is_never_counted_in_part():
    """Chunks of a server that predates multi_agent_episode_chunks (0 on every chunk) or of an episode whose early
    chunks never came are never counted as an episode; the oldest open ones go once `max_open` are open."""
    played = play(cartpoles, CARTPOLES, 60, fragment=8)
    chunks = played.chunks()
    counter = MultiAgentReturns(max_open=3)
    for chunk in chunks:
        if not chunk.multi_agent_episode_chunks:  # the last chunks of every episode lost
            assert counter.add(chunk) is None
    assert len(counter.open) == 3
    old = MultiAgentReturns(max_open=3)
    for chunk in chunks:
        chunk.multi_agent_episode_chunks = 0  # an old server's
        assert old.add(chunk) is None
    assert len(old.open) == 3
    missing_first, seen = MultiAgentReturns(), set()
    for chunk in played.chunks():  # each episode's first chunk lost
        if chunk.multi_agent_episode_id in seen:
            assert missing_first.add(chunk) is None
        seen.add(chunk.multi_agent_episode_id)
    assert set(missing_first.open) == seen


async def test_a_learners_status_and_history_report_multi_agent_episodes(learner_settings):
    """Through a real learner: /status's mean return is over the episodes' sums of both agents' returns, each
    module's and agent's their own; each history row is one multi-agent episode (return, env steps)."""
    spec = {**CARTPOLES, "multi_agent": {"policy_mapping_fn": "per_agent"}}
    played = play(cartpoles, spec, 120, fragment=8)
    messages = batches(played)
    server = LearnerServer(learner_settings(env=None, spec=spec))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = learner_pb2_grpc.LearnerServiceStub(channel).SubmitEpisodes()
            for message in messages:
                await call.write(message)
                async with asyncio.timeout(30):
                    await call.read()
            await call.done_writing()
        learner = server.learner
        status = learner.status()
        history = learner.progress.episodes.page(0)["rows"]
    finally:
        await server.stop()
    order = closing_order(messages)
    expected = [played.episodes[e] for e in order]
    last = [r for r, _ in expected][-RETURN_WINDOW:]
    assert status["episodes"] == len(expected)
    assert status["mean_return"] == pytest.approx(sum(last) / len(last))
    sums = module_and_agent_returns(played)
    for name, index in (("module_mean_returns", 0), ("agent_mean_returns", 1)):
        kept = windows([kv for e in order for kv in sums[e][index].items()])
        assert status[name] == pytest.approx({k: sum(v) / len(v) for k, v in kept.items()}), name
    assert set(status["module_mean_returns"]) == {"agent_0", "agent_1"}
    assert [(row["return"], row["length"]) for row in history] == expected
