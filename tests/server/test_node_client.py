"""The Node.js client of clients/node, written from proto/README.md and the .proto files alone, against a real
server: it plays CartPole episodes on its own JavaScript CartPole, and the server's episode files must hold
exactly the episodes it reports; a hello with wrong spaces gets the status the README promises. In multi-agent
sessions it plays examples/multi_agent_cartpole.py's game and PettingZoo's tic-tac-toe against the examples'
run specs, and the per-agent chunks must hold each agent's steps, rewards and flags as it reports them; its
malformed multi-agent messages get the statuses and messages the README gives.

Its npm dependencies (package-lock.json) are installed once per session with `npm ci` into .cache/node-client/
(gitignored), under a key of the lock, so later runs with the same lock install nothing. Without node or npm
the tests skip, saying why (they fail under CI=true); so do they where the npm registry cannot be reached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from support.servers import shipped
from support.tools import required_command

from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.spec.run import RunSpec
from rlgate.storage.episode_files import read_episodes

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "clients" / "node"
CACHE = ROOT / ".cache" / "node-client"
TOKEN = "s3cret"
CLIENT_TIMEOUT_S = 60  # a run of a few short episodes takes well under a second
NPM_CI_TIMEOUT_S = 150
# npm's words for a registry it cannot reach: outside CI that skips the tests instead of failing them.
OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "network")

pytestmark = pytest.mark.timeout(NPM_CI_TIMEOUT_S + 2 * CLIENT_TIMEOUT_S)


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def node_client() -> tuple[str, Path]:
    """(node, the folder to run client.mjs in): the client beside node_modules installed by `npm ci`."""
    node = required_command("node", "nodejs")
    npm = required_command("npm", "npm")
    manifest = [(CLIENT / name).read_bytes() for name in ("package.json", "package-lock.json")]
    key = hashlib.sha256(b"\0".join(manifest)).hexdigest()[:16]
    folder = CACHE / key
    if not (folder / ".installed").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        for stale in CACHE.iterdir():  # installs of earlier locks, and installs cut short over an hour ago
            if stale.is_dir() and stale != folder and (not stale.name.startswith(".") or _older_than_an_hour(stale)):
                shutil.rmtree(stale, ignore_errors=True)
        # Installed beside the target, then renamed into place: a cut-short `npm ci` leaves no half install.
        work = Path(tempfile.mkdtemp(prefix=".install-", dir=CACHE))
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(CLIENT / name, work / name)
            command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"]
            try:
                done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=NPM_CI_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # subprocess.run kills npm before raising
                done = subprocess.CompletedProcess(command, -1, "", f"npm ci took over {NPM_CI_TIMEOUT_S} s")
            if done.returncode != 0:
                output = done.stdout + done.stderr
                offline = [line for line in output.splitlines() if any(word in line for word in OFFLINE)]
                if not strict() and (done.returncode == -1 or offline):
                    said = (offline or output.splitlines() or [""])[0].strip()
                    pytest.skip(f"`npm ci` in clients/node cannot reach the npm registry: {said}")
                pytest.fail(f"`npm ci` in clients/node failed: {output[-3000:]}")
            (work / ".installed").touch()
            try:
                work.rename(folder)
            except OSError:  # another pytest run in this checkout installed the same lock meanwhile
                if not (folder / ".installed").exists():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    # Beside its node_modules, as ES imports need; replaced whole, so a client another run has started reads
    # the files it started with.
    for source in CLIENT.glob("*.mjs"):
        copy = folder / f".{source.stem}-{os.getpid()}.mjs"
        shutil.copy(source, copy)
        os.replace(copy, folder / source.name)
    return node, folder


def _older_than_an_hour(path: Path) -> bool:
    return time.time() - path.stat().st_mtime > 3600


def client_command(node_client: tuple[str, Path], port: int, *args: str) -> list[str]:
    """The command line of client.mjs against 127.0.0.1:port (run in node_client's folder), giving up on its own
    before CLIENT_TIMEOUT_S."""
    node, folder = node_client
    command = [node, str(folder / "client.mjs"), "--server", f"127.0.0.1:{port}", "--proto-dir", str(ROOT / "proto")]
    return [*command, "--timeout-s", str(CLIENT_TIMEOUT_S - 5), *args]


async def client_output(node_client: tuple[str, Path], port: int, *args: str) -> tuple[int, str, str]:
    """Runs client.mjs against 127.0.0.1:port to its end: (exit status, stdout, stderr); killed if it outlives its
    timeout."""
    process = await asyncio.create_subprocess_exec(
        *client_command(node_client, port, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=node_client[1],
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), CLIENT_TIMEOUT_S)
    finally:
        if process.returncode is None:  # timed out (or the test was cancelled): never leave it running
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def run_client(node_client: tuple[str, Path], port: int, *args: str) -> dict:
    """Runs client.mjs against 127.0.0.1:port and returns its JSON summary."""
    code, stdout, stderr = await client_output(node_client, port, *args)
    assert code == 0, f"client.mjs exited {code}: {stderr[-3000:]}"
    return json.loads(stdout)


async def test_the_node_client_plays_episodes_that_the_server_records_as_it_reports(
    server_factory, tmp_path, node_client
):
    server = await server_factory(env="CartPole-v1", token=TOKEN)
    summary = await run_client(node_client, server.port, "--episodes", "5", "--seed", "7", "--token", TOKEN)
    await server.stop()  # writes the episode files still queued

    assert summary["health"] == {"": "SERVING", "rlgate.v1.PolicyService": "SERVING"}
    assert summary["status"] == "OK" and summary["episodes"] == 5
    lengths, returns = summary["lengths"], summary["returns"]
    assert len(lengths) == 5 and all(1 <= n <= 500 for n in lengths)
    assert returns == lengths and summary["env_steps"] == sum(lengths)
    assert all(t or u for t, u in zip(summary["terminated"], summary["truncated"], strict=True))
    assert summary["model_versions"] == [0]  # a fresh model, no learner

    # The server's episode files: every chunk of this session, joined into episodes (chunk 0 holds the reset).
    chunks = sorted(read_episodes(tmp_path / "episodes"), key=lambda e: (e.id_, e.chunk_index))
    assert chunks and all(c.id_.startswith(summary["session_id"]) for c in chunks)
    episodes: dict[str, list] = {}
    for chunk in chunks:
        episodes.setdefault(chunk.id_, []).append(chunk)
    assert len(episodes) == 5  # exactly the client's: it closed between episodes, so nothing ran on
    by_reset = {}
    for parts in episodes.values():
        assert [p.chunk_index for p in parts] == list(range(len(parts)))
        first = parts[0].get_observations(0)
        by_reset[first.tobytes()] = parts
    # Each reported episode, found by its reset observation (float32, as the client sent it).
    for i, reset in enumerate(summary["reset_observations"]):
        parts = by_reset.pop(np.asarray(reset, np.float32).tobytes())
        assert sum(len(p) for p in parts) == lengths[i]
        assert sum(p.get_return() for p in parts) == returns[i]
        assert all(np.all(p.get_rewards() == 1.0) for p in parts)
        assert (parts[-1].is_terminated, parts[-1].is_truncated) == (summary["terminated"][i], summary["truncated"][i])
        assert not any(p.is_done for p in parts[:-1])
        # The JavaScript CartPole moves as gymnasium's does: each recorded step, replayed from the recorded
        # observation with the recorded action, lands where the client said (float32 rounding apart).
        env = gym.make("CartPole-v1").unwrapped
        env.reset(seed=0)
        start = 0
        for part in parts:
            # The infos the client sent with every observation (its env's step count), kept with them.
            assert [info["steps"] for info in part.get_infos()] == list(range(start, start + len(part) + 1))
            start += len(part)
            observations, actions = part.get_observations(), part.get_actions()
            for t, action in enumerate(actions):
                env.state = observations[t].astype(np.float64)
                obs, reward, terminated, _, _ = env.step(int(action))
                np.testing.assert_allclose(obs, observations[t + 1], rtol=0, atol=1e-5)
                assert reward == part.get_rewards()[t]
        assert terminated == summary["terminated"][i]
    assert not by_reset


async def test_the_node_client_follows_reconnect_to_a_new_stream_with_no_episode_cut(
    server_factory, tmp_path, node_client
):
    """A server that hands every session over after ~0.05 s (Actions.reconnect): the client closes (OK), opens a
    new stream and starts a new episode there, again and again; the episode files hold exactly its episodes, none
    cut, each in a session it opened. A client that sent another step instead would end with UNAVAILABLE."""
    server = await server_factory(env="CartPole-v1", max_session_age_s=0.05)
    summary = await run_client(node_client, server.port, "--episodes", "12", "--seed", "5")
    await server.stop()

    assert summary["status"] == "OK" and summary["episodes"] == 12
    assert summary["handovers"] >= 2 and len(summary["session_ids"]) in (summary["handovers"], summary["handovers"] + 1)
    assert server.metrics.handovers._value.get() == summary["handovers"]
    episodes: dict[str, list] = {}
    for chunk in read_episodes(tmp_path / "episodes"):
        episodes.setdefault(chunk.id_, []).append(chunk)
    assert all(episode_id.rsplit("-", 1)[0] in summary["session_ids"] for episode_id in episodes)
    recorded = sorted(
        (sum(len(c) for c in chunks), max(chunks, key=lambda c: c.chunk_index).is_terminated)
        for chunks in episodes.values()
    )
    assert recorded == sorted(zip(summary["lengths"], summary["terminated"], strict=True))


async def test_a_node_hello_with_wrong_spaces_gets_failed_precondition_naming_the_field(server_factory, node_client):
    server = await server_factory(env="CartPole-v1")
    answer = await run_client(node_client, server.port, "--mode", "wrong-spaces")
    assert answer == {
        "code": 9,
        "code_name": "FAILED_PRECONDITION",
        "details": "the hello's spaces must equal the served model's; they differ in (server != client): "
        "observation_space.dtype: float32 != float64",
    }


# --- multi-agent sessions (proto/README.md, "Multi-agent sessions") ------------------------------------------


def recorded_agents(directory: Path, session_id: str) -> dict[str, dict[str, list]]:
    """The server's episode files as {multi-agent episode id: {agent id: its chunks, in order}}."""
    episodes: dict[str, dict[str, list]] = {}
    for message in shipped(directory):
        assert message.multi_agent_episode_id.startswith(session_id)
        agents = episodes.setdefault(message.multi_agent_episode_id, {})
        agents.setdefault(message.agent_id, []).append((message, episode_from_proto(message)))
    for agents in episodes.values():
        for chunks in agents.values():
            chunks.sort(key=lambda chunk: chunk[1].chunk_index)
            assert [episode.chunk_index for _, episode in chunks] == list(range(len(chunks)))
    return episodes


def match_reported(summary: dict, recorded: dict[str, dict[str, list]]) -> list[tuple[dict, dict, bool]]:
    """Each episode the client reports (ended, or running when it closed) with the recorded one that holds the
    same agents with the same actions, as (reported, {agent: its chunks}, closed): every recorded episode once."""

    def key(agents: dict) -> tuple:
        return tuple(sorted((agent, tuple(actions)) for agent, actions in agents.items()))

    by_actions = {
        key({agent: [int(a) for _, e in chunks for a in e.get_actions()] for agent, chunks in agents.items()}): agents
        for agents in recorded.values()
    }
    assert len(by_actions) == len(recorded)
    matched = []
    for closed, episodes in ((False, summary["episodes"]), (True, summary["running"])):
        for episode in episodes:
            # An agent's steps are recorded up to its last observation (Close drops an action still waiting
            # for one); an agent with no step yet has no chunk.
            agents = {a: r["actions"][: len(r["rewards"])] for a, r in episode["agents"].items() if r["rewards"]}
            matched.append((episode, by_actions.pop(key(agents)), closed))
    assert not by_actions, f"recorded episodes the client did not report: {list(by_actions)}"
    return matched


def check_agents(reported: dict, agents: dict[str, list], closed: bool, env_steps: bool = True) -> None:
    """One agent's recorded chunks hold what the client sent for it: rewards, flags, infos, env steps."""
    assert set(agents) == {a for a, r in reported["agents"].items() if r["rewards"]}
    for agent, chunks in agents.items():
        record = reported["agents"][agent]
        rewards = [float(r) for _, e in chunks for r in e.get_rewards()]
        assert rewards == record["rewards"] and sum(rewards) == record["return"]
        assert sum(len(e) for _, e in chunks) == len(record["rewards"])
        last = chunks[-1][1]
        assert not any(e.is_done for _, e in chunks[:-1])
        if closed:  # Close ships the running episodes as truncated
            assert (last.is_terminated, last.is_truncated) == (False, True)
        else:  # each agent keeps the flags the client sent for it
            assert (last.is_terminated, last.is_truncated) == (record["terminated"], record["truncated"])
    if env_steps:  # the episode's env steps ride on its first agent chunk
        assert sum(m.multi_agent_env_steps for chunks in agents.values() for m, _ in chunks) == reported["env_steps"]


@pytest.mark.usefixtures("examples_importable")
async def test_node_multi_agent_cartpole_is_recorded_per_agent_as_the_client_reports(
    server_factory, tmp_path, node_client
):
    """examples/multi_agent_cartpole.toml's server, the client's own two-pole CartPole in 2 sub-envs with a
    20-step time limit: poles fall (terminated) or time out (truncated), agents leave while the other one
    plays on, a sub-env starts its next episode while the other's goes on, and Close ends the one running."""
    server = await server_factory(spec=RunSpec.load(ROOT / "examples" / "multi_agent_cartpole.toml"))
    args = ["--mode", "multi-agent", "--game", "cartpole", "--envs", "2", "--episodes", "6", "--seed", "1"]
    summary = await run_client(node_client, server.port, *args, "--max-episode-steps", "20")
    await server.stop()

    assert summary["health"] == {"": "SERVING", "rlgate.v1.PolicyService": "SERVING"}
    assert summary["status"] == "OK" and summary["model_versions"] == [0]
    assert len(summary["episodes"]) >= 6
    records = [r for e in summary["episodes"] for r in e["agents"].values()]
    # What this seed covers: both ways of leaving, agents of one episode leaving at different steps, and an
    # episode still running at the Close.
    assert any(r["terminated"] for r in records) and any(r["truncated"] for r in records)
    assert any(len({len(r["actions"]) for r in e["agents"].values()}) > 1 for e in summary["episodes"])
    assert summary["running"]

    recorded = recorded_agents(tmp_path / "episodes", summary["session_id"])
    matched = match_reported(summary, recorded)
    assert {m.module_id for agents in recorded.values() for chunks in agents.values() for m, _ in chunks} == {
        "default_policy"
    }
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    for reported, agents, closed in matched:
        check_agents(reported, agents, closed)
        assert set(reported["agents"]) == {"agent_0", "agent_1"}
        for ((_, episode),) in agents.values():  # one chunk each: no episode reaches rollout_fragment_length (32)
            # Every observation with its info (the pole's step count), and each step replayed by gymnasium's
            # CartPole from the recorded observation and action lands on the next one.
            observations, actions = episode.get_observations(), episode.get_actions()
            assert [info["steps"] for info in episode.get_infos()] == list(range(len(actions) + 1))
            assert observations.dtype == np.float32
            for t, action in enumerate(actions):
                env.state, env.steps_beyond_terminated = observations[t].astype(np.float64), None
                obs, _, _, _, _ = env.step(int(action))
                np.testing.assert_allclose(obs, observations[t + 1], rtol=0, atol=1e-5)


def flat_observation(env, agent: str) -> np.ndarray:
    """A PettingZoo env's observation for `agent`, flattened as the spec's FlattenObservations stores it."""
    return gym.spaces.flatten(env.observation_space(agent), env.observe(agent)).astype(np.float32)


@pytest.mark.usefixtures("examples_importable")
async def test_node_tictactoe_players_take_turns_and_the_loser_is_paid_without_acting(
    server_factory, tmp_path, node_client
):
    """examples/tictactoe.toml's server (its action-masking module, "main" against "random"), the client's own
    tic-tac-toe in 3 sub-envs, sent as a turn-based env: one player observes per step, player_2 joins at the
    second step, and the game's last step pays both players, the one that did not just move too; Close ends
    the games still running. PettingZoo's tictactoe_v3 replays every recorded game: the same observations
    (flattened by the spec's FlattenObservations connector)."""
    tictactoe = pytest.importorskip("pettingzoo.classic.tictactoe_v3")
    # Seeded, so that the games' moves are the same whatever the process sampled before (once every game ended at
    # the same step, and none was left running at the Close).
    server = await server_factory(spec=RunSpec.load(ROOT / "examples" / "tictactoe.toml"), seed=0)
    args = ["--mode", "multi-agent", "--game", "tictactoe", "--envs", "3", "--episodes", "7", "--seed", "0"]
    summary = await run_client(node_client, server.port, *args)
    await server.stop()
    assert summary["status"] == "OK" and summary["model_versions"] == [0] and len(summary["episodes"]) >= 7
    # Games still running at the Close: each player's chunk ends at its last observation, truncated (the move
    # a player made after it, waiting for its next observation, is not recorded).
    assert summary["running"]

    recorded = recorded_agents(tmp_path / "episodes", summary["session_id"])
    matched = match_reported(summary, recorded)
    losers = 0
    for reported, agents, closed in matched:
        check_agents(reported, agents, closed)
        moves = {agent: list(record["actions"]) for agent, record in reported["agents"].items()}
        env = tictactoe.raw_env()
        env.reset()
        observe = partial(flat_observation, env)
        expected = {"player_1": [observe("player_1")], "player_2": []}
        turns = {"player_1": [0], "player_2": []}  # the infos the client sends: moves made so far
        for turn in range(1, sum(len(m) for m in moves.values()) + 1):
            env.step(moves[env.agent_selection].pop(0))
            over = all(env.terminations.values())
            for agent in env.possible_agents if over else [env.agent_selection]:
                expected[agent].append(observe(agent))
                turns[agent].append(turn)
        assert not any(moves.values())
        for agent, ((message, episode),) in agents.items():
            assert message.module_id in ("main", "random")
            np.testing.assert_array_equal(episode.get_observations(), expected[agent][: len(episode) + 1])
            assert [info["turn"] for info in episode.get_infos()] == turns[agent][: len(episode) + 1]
        if not closed:
            assert over and {a: r["return"] for a, r in reported["agents"].items()} == env.rewards
            assert all(r["terminated"] and not r["truncated"] for r in reported["agents"].values())
            losers += -1 in env.rewards.values()
    assert losers  # a game won: its loser was paid -1 in a step where it did not act


async def test_node_agents_that_leave_differently_in_one_step_end_the_episode_with_their_own_flags(
    server_factory, tmp_path, node_client
):
    """Sub-env 0's agent_0 is terminated and agent_1 truncated in the same step, "__all__" false in both maps:
    every agent is done, so the episode is over (no actions for it, the next step starts a new one), and each
    agent's chunk keeps its own flag (a truncated agent is not marked terminated)."""
    server = await server_factory(spec=RunSpec.parse({"multi_agent": {"policy_mapping_fn": "shared"}}, "test"))
    answer = await run_client(node_client, server.port, "--mode", "multi-agent-script", "--case", "leave-differently")
    await server.stop()
    assert (answer["code_name"], answer["details"]) == ("OK", "")
    both = ["agent_0", "agent_1"]
    assert answer["answers"] == [[both, both], [[], both], [both, both]]
    recorded = recorded_agents(tmp_path / "episodes", answer["session_id"])
    by_length = {
        len(next(iter(agents.values()))[0][1]): {
            agent: (e.is_terminated, e.is_truncated) for agent, ((_, e),) in agents.items()
        }
        for agents in recorded.values()
    }
    # Sub-env 0's first episode (1 step) and sub-env 1's (2 steps, truncated by Close); sub-env 0's second
    # episode has no step yet, so no chunk.
    assert by_length == {
        1: {"agent_0": (True, False), "agent_1": (False, True)},
        2: {"agent_0": (False, True), "agent_1": (False, True)},
    }


@pytest.mark.parametrize(
    ("case", "code", "details", "answers"),
    [
        (
            "no-all",
            "INVALID_ARGUMENT",
            "agents[0].terminateds: no '__all__': say whether the episode is over for all agents",
            0,
        ),
        (
            "unknown-agent",
            "INVALID_ARGUMENT",
            "agents[1].obs: unknown agent 'agent_7' (the hello declared agent_0, agent_1)",
            0,
        ),
        ("no-reward", "INVALID_ARGUMENT", "agents[0]: agent 'agent_1' acted and observed again but got no reward", 1),
        ("done-agent", "INVALID_ARGUMENT", "agents[0]: agent 'agent_1' is done but got data in a later step", 2),
        (
            "truncated-without-observation",
            "INVALID_ARGUMENT",
            "agents[0]: agent 'agent_1' acted and was truncated without a last observation (needed to bootstrap)",
            1,
        ),
        ("too-few-sub-envs", "INVALID_ARGUMENT", "agents: 1 sub-env steps != num_envs 2", 0),
        (
            "single-agent-hello",
            "FAILED_PRECONDITION",
            "this server serves a multi-agent run: declare the env's agents in hello.agents (rlgate env: a PettingZoo "
            "env and a run spec with [multi_agent])",
            0,
        ),
        (
            "unknown-agent-hello",
            "FAILED_PRECONDITION",
            "agent 'agent_7': the served model has no such agent (agents: agent_0, agent_1)",
            0,
        ),
    ],
)
@pytest.mark.usefixtures("examples_importable")
async def test_a_malformed_node_multi_agent_message_gets_the_documented_status(
    server_factory, node_client, case, code, details, answers
):
    server = await server_factory(spec=RunSpec.load(ROOT / "examples" / "multi_agent_cartpole.toml"))
    answer = await run_client(node_client, server.port, "--mode", "multi-agent-script", "--case", case)
    assert (answer["code_name"], answer["details"], len(answer["answers"])) == (code, details, answers)
