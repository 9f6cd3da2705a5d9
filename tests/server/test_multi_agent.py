"""Multi-agent sessions against a real server: PettingZoo parallel and turn-based (AEC) envs, many sub-envs,
episodes shipped as their agents' chunks, and bad input answered with INVALID_ARGUMENT naming the agent."""

from __future__ import annotations

import asyncio

import grpc
import gymnasium as gym
import numpy as np
import pytest
from support.chunks import decoded
from support.servers import BOX4, DISCRETE2, SELF_PLAY, RawStream, running_client, shipped, target, wait_for_steps

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.episodes import MultiAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.spec.run import RunSpec
from rlgate.v1 import policy_pb2 as pb

pytestmark = pytest.mark.usefixtures("examples_importable")
pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3  # noqa: E402


def multi_agent_spec(mapping: str = "shared", **sampling) -> RunSpec:
    return RunSpec.parse(
        {
            "env": {"id": "examples.multi_agent_cartpole:MultiAgentCartPole"},
            "multi_agent": {"policy_mapping_fn": mapping},
            "sampling": sampling,
        },
        "test",
    )


@pytest.mark.parametrize("mapping", ["shared", "per_agent"])
async def test_parallel_env_sub_envs_ship_agent_chunks(server_factory, tmp_path, mapping):
    server = await server_factory(spec=multi_agent_spec(mapping, rollout_fragment_length=16))
    from examples.multi_agent_cartpole import MultiAgentCartPole

    envs = [MultiAgentCartPole(num_agents=2) for _ in range(3)]
    stats = await asyncio.wait_for(EnvClient(envs, target(server), seed=1).run(max_steps=300), 60)
    assert stats.env_steps >= 300 and stats.episodes > 0
    await server.stop()
    chunks = shipped(tmp_path / "episodes")
    agents = {c.agent_id for c in chunks}
    modules = {c.module_id for c in chunks}
    assert agents == {"agent_0", "agent_1"}
    assert modules == ({"default_policy"} if mapping == "shared" else {"agent_0", "agent_1"})
    for message in chunks:
        episode = episode_from_proto(message)
        assert len(episode) <= 16 and episode.multi_agent_episode_id
        assert (episode.get_rewards() == 1.0).all()  # CartPole pays 1 per step: nothing lost or doubled
    # Every env step is counted once: on the first agent chunk of each multi-agent chunk.
    assert sum(c.multi_agent_env_steps for c in chunks) >= 300
    assert sum(c.multi_agent_env_steps for c in chunks) <= stats.env_steps + 3


async def test_turn_based_game_gets_one_action_per_turn(server_factory, tmp_path):
    spec = RunSpec.parse(
        {
            "env": {"id": "pettingzoo.classic.tictactoe_v3:env"},
            "multi_agent": {},
            "sampling": {"batch_mode": "complete_episodes"},
        },
        "test",
    )
    server = await server_factory(spec=spec)
    envs = [tictactoe_v3.env() for _ in range(2)]
    stats = await asyncio.wait_for(EnvClient(envs, target(server), seed=0).run(max_steps=200), 60)
    await server.stop()
    assert stats.episodes > 5
    chunks = [episode_from_proto(c) for c in shipped(tmp_path / "episodes")]
    assert {c.agent_id for c in chunks} == {"player_1", "player_2"}
    # Whole games (complete_episodes), but for the games running when the client closed: shipped truncated.
    unfinished = {c.multi_agent_episode_id for c in chunks if not c.is_terminated}
    assert len(unfinished) <= len(envs)
    finals = {}
    for chunk in chunks:
        assert chunk.get_observations(-1).shape == (27,)  # flattened by FlattenObservations(multi_agent=True)
        assert set(np.round(chunk.get_rewards()[:-1], 3)) <= {0.0}  # only a game's end pays
        if chunk.multi_agent_episode_id not in unfinished:
            finals.setdefault(chunk.multi_agent_episode_id, []).append(float(chunk.get_rewards()[-1]))
    # A winner and a loser, a draw, or an illegal move (which loses; the other player gets 0).
    assert finals and all(sorted(r) in ([-1.0, 1.0], [0.0, 0.0], [-1.0, 0.0]) for r in finals.values())


async def test_a_per_episode_mapping_maps_each_game_anew(server_factory, tmp_path):
    """examples/self_play.py maps each game's seats from its episode id: both to "main", or one to "main" and
    the other to "random", on either seat; every chunk names the module its agent acted with in that game."""
    from examples.self_play import main_vs_random

    server = await server_factory(spec=RunSpec.parse(SELF_PLAY, "test"))
    envs = [tictactoe_v3.env() for _ in range(4)]
    stats = await asyncio.wait_for(EnvClient(envs, target(server), seed=0).run(max_steps=600), 60)
    await server.stop()
    assert stats.episodes > 40
    games: dict[str, dict[str, str]] = {}
    for message in shipped(tmp_path / "episodes"):
        chunk = episode_from_proto(message)
        games.setdefault(chunk.multi_agent_episode_id, {})[chunk.agent_id] = chunk.module_id
        assert chunk.module_id == main_vs_random(chunk.agent_id, MultiAgentEpisode(chunk.multi_agent_episode_id))
        assert chunk.module_id in ("main", "random")
    seatings = {tuple(modules[p] for p in ("player_1", "player_2")) for modules in games.values() if len(modules) == 2}
    assert seatings == {("main", "main"), ("main", "random"), ("random", "main")}


def agents_hello(agents=("a", "b"), num_envs: int = 1) -> pb.ClientMessage:
    spaces = [
        pb.AgentSpaces(
            agent_id=a, observation_space=codec.space_to_proto(BOX4), action_space=codec.space_to_proto(DISCRETE2)
        )
        for a in agents
    ]
    return pb.ClientMessage(hello=pb.Hello(client_id="raw", num_envs=num_envs, explore=True, agents=spaces))


def agents_step(
    obs: dict, rewards: dict | None = None, terminateds: dict | None = None, infos: dict | None = None
) -> pb.ClientMessage:
    return pb.ClientMessage(
        step=pb.Step(
            agents=[
                pb.AgentsStep(
                    obs={a: codec.to_value(o) for a, o in obs.items()},
                    rewards=rewards or {},
                    terminateds={"__all__": False} if terminateds is None else terminateds,
                    truncateds={"__all__": False},
                    infos={a: codec.to_struct(info) for a, info in (infos or {}).items()},
                )
            ]
        )
    )


OBS = np.zeros(4, np.float32)


async def ma_server(server_factory):
    spec = RunSpec.parse({"multi_agent": {"policy_mapping_fn": "per_agent"}}, "test")
    return await server_factory(spec=spec)


async def test_actions_go_to_exactly_the_agents_that_observed(server_factory):
    server = await ma_server(server_factory)
    stream = RawStream(server)
    await stream.send(agents_hello())
    assert (await stream.recv()).HasField("welcome")
    await stream.send(agents_step({"a": OBS}))
    reply = await stream.recv()
    assert [set(per_env.actions) for per_env in reply.actions.agents] == [{"a"}]
    await stream.send(agents_step({"a": OBS, "b": OBS}, rewards={"a": 1.0, "b": 0.5}))
    reply = await stream.recv()
    assert [set(per_env.actions) for per_env in reply.actions.agents] == [{"a", "b"}]
    await stream.send(agents_step({"a": OBS, "b": OBS}, {"a": 1.0, "b": 1.0}, {"a": True, "__all__": False}))
    reply = await stream.recv()
    assert [set(per_env.actions) for per_env in reply.actions.agents] == [{"b"}]  # a is done
    await stream.close()


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([agents_step({"c": OBS})], "unknown agent 'c'"),
        ([agents_step({"a": OBS}, terminateds={"a": False})], "terminateds: no '__all__'"),
        ([agents_step({"a": np.full(4, 5.0, np.float32)})], "obs['a']: value 5.0"),
        ([agents_step({"a": OBS}), agents_step({"a": OBS}, {"a": float("nan")})], "agents[0].rewards['a']: NaN"),
        # Finite as a double, inf as the float32 rewards are stored in: refused as a single-agent step's would be.
        (
            [agents_step({"a": OBS}), agents_step({"a": OBS}, {"a": 1e300})],
            "agents[0].rewards['a']: value 1e+300 is not finite as float32",
        ),
        # Rewards float32 holds, summed while agent 'a' waits for its next observation into one it does not.
        (
            [
                agents_step({"a": OBS, "b": OBS}),
                agents_step({"b": OBS}, {"a": 3e38, "b": 0.0}),
                agents_step({"b": OBS}, {"a": 3e38, "b": 0.0}),
            ],
            "agents[0]: agent 'a': its rewards since its last step sum to 6e+38, not finite as float32",
        ),
        ([agents_step({"a": OBS}), agents_step({"a": OBS})], "agent 'a' acted and observed again but got no reward"),
        ([agents_step({})], "no agent observes"),
        ([agents_step({"a": OBS, "b": OBS}, terminateds={"b": True})], "agents[0].terminateds: no '__all__'"),
        ([agents_step({"a": np.array([0, 0, np.nan, 0], np.float32)})], "agents[0].obs['a']: NaN at index (2,)"),
        ([agents_step({"a": np.zeros((1, 4), np.float32)})], "agents[0].obs['a']: shape (1, 4) != (4,)"),
        ([agents_step({"a": OBS}, infos={"a": {"values": list(range(40_000))}})], "agents[*].infos: 440020 bytes"),
    ],
)
async def test_bad_multi_agent_steps_name_the_agent(server_factory, messages, expected):
    server = await ma_server(server_factory)
    stream = RawStream(server)
    await stream.send(agents_hello())
    await stream.recv()
    for message in messages[:-1]:
        await stream.send(message)
        await stream.recv()
    await stream.send(messages[-1])
    code, details = await stream.status()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in details
    await stream.close()


async def test_non_finite_agent_values_are_counted_as_single_agent_ones(server_factory):
    """A NaN observation, an infinite reward, and a reward sum float32 cannot hold (inf once stored)."""
    server = await ma_server(server_factory)
    overflow = [agents_step({"a": OBS, "b": OBS}), *[agents_step({"b": OBS}, {"a": 3e38, "b": 0.0})] * 2]
    for messages in ([agents_step({"a": np.full(4, np.nan, np.float32)})], [agents_step({"a": OBS}),
                     agents_step({"a": OBS}, {"a": float("inf")})], overflow):  # fmt: skip
        stream = RawStream(server)
        for message in [agents_hello(), *messages[:-1]]:
            await stream.send(message)
            await stream.recv()
        await stream.send(messages[-1])
        code, _ = await stream.status()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        await stream.close()
    assert server.status.status()["non_finite_rejected"] == {"obs": 1, "reward": 2}


async def test_agent_infos_keep_nan_and_infinities_to_the_shipped_chunk(server_factory, tmp_path):
    server = await ma_server(server_factory)
    stream = RawStream(server)
    await stream.send(agents_hello())
    await stream.recv()
    steps = [(agents_step({"a": OBS}), {"nan": np.nan}), (agents_step({"a": OBS}, {"a": 1.0}), {"inf": np.inf})]
    for message, info in steps:  # the first is the reset step
        message.step.agents[0].infos["a"].CopyFrom(codec.to_struct(info))
        await stream.send(message)
        assert (await stream.recv()).HasField("actions")
    await stream.send(pb.ClientMessage(close=pb.Close()))
    assert (await stream.status())[0] == grpc.StatusCode.OK
    await stream.close()
    await server.stop()
    (chunk,) = [episode_from_proto(c) for c in shipped(tmp_path / "episodes")]
    first, last = chunk.get_infos()
    assert np.isnan(first["nan"]) and last == {"inf": np.inf}


@pytest.mark.parametrize(
    ("observation_space", "action_space"),
    [(BOX4, gym.spaces.Dict({"x": DISCRETE2})), (gym.spaces.Tuple([]), DISCRETE2)],
)
async def test_agent_spaces_no_model_can_be_built_for_are_invalid_argument(
    server_factory, observation_space, action_space
):
    server = await ma_server(server_factory)
    stream = RawStream(server)
    agent = pb.AgentSpaces(
        agent_id="a",
        observation_space=codec.space_to_proto(observation_space),
        action_space=codec.space_to_proto(action_space),
    )
    await stream.send(pb.ClientMessage(hello=pb.Hello(client_id="raw", num_envs=1, agents=[agent])))
    code, details = await stream.status()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no model for the hello's spaces" in details
    await stream.close()


async def test_a_hello_of_more_agents_than_its_spaces_budget_is_refused_at_once(server_factory):
    """Agents' spaces count together against the spaces one message may hold (codec.MAX_SPACES); each cost
    gymnasium microseconds to build, so a 16 MiB hello of 700,000 agents held every client for 12 s."""
    server = await ma_server(server_factory)
    stream = RawStream(server)
    await stream.send(agents_hello(agents=[f"agent_{i}" for i in range(10_000)]))
    code, details = await stream.status()
    await stream.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("hello.agents[8192].observation_space: the message holds more than 16384 spaces")
    assert server.host.core is None


async def test_a_hello_of_agents_whose_modules_would_be_too_large_in_all_is_refused_before_building(server_factory):
    """Each default module is bounded (2**28 parameters); per_agent builds one per agent a hello declares, so their
    sum is bounded too: one hello of 40 agents made 8.4 million parameters each, 1.3 GB (of 8,192 agents, 270 GB)."""
    spec = {"multi_agent": {"policy_mapping_fn": "per_agent"}, "model": {"config": {"fcnet_hiddens": [2048, 2048]}}}
    server = await server_factory(spec=RunSpec.parse(spec, "test"))
    stream = RawStream(server)
    await stream.send(agents_hello(agents=[f"agent_{i}" for i in range(40)]))
    code, details = await stream.status()
    await stream.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("no model for the hello's spaces: The default model's 40 modules would have 336,773,240")
    assert server.host.core is None


async def test_any_agent_id_names_a_module_of_its_own(server_factory):
    """per_agent makes each agent id a module id: torch refuses ones with a "." or an attribute's name as
    submodule names, and the fresh model's build failed with INTERNAL."""
    server = await ma_server(server_factory)
    agents = ("pursuer.0", "keys", "training", "../x", "a\x00b")
    stream = RawStream(server)
    await stream.send(agents_hello(agents=agents))
    assert (await stream.recv()).HasField("welcome")
    await stream.send(agents_step(dict.fromkeys(agents, OBS)))
    reply = await stream.recv()
    assert [set(per_env.actions) for per_env in reply.actions.agents] == [set(agents)]
    await stream.close()
    assert sorted(server.host.core.module) == sorted(agents)


async def test_single_and_multi_agent_clients_are_told_apart(server_factory):
    server = await ma_server(server_factory)
    stream = RawStream(server)
    from support.servers import hello

    await stream.send(hello())
    code, details = await stream.status()
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "hello.agents" in details
    assert details.endswith("(rlgate env: a PettingZoo env and a run spec with [multi_agent])")  # what to do on the CLI
    stream = RawStream(server)
    await stream.send(agents_hello(agents=("a", "zz")))
    await stream.send(agents_step({"a": OBS}))
    assert (await stream.recv()).HasField("welcome")  # per_agent: a module for any agent with these spaces
    await stream.close()


def test_flush_while_a_step_waits_ships_every_env_step_once(examples_importable):
    """What the learner counts (each multi-agent chunk's env steps, on one of its agents' chunks) equals the env
    steps the session took, when flushes come between observe() and record(), as they do while sampling pauses."""
    from examples.multi_agent_cartpole import MultiAgentCartPole
    from rlgate.core.columns import Columns
    from rlgate.envs.agent_envs import AgentEnvs
    from rlgate.policy.acting import ActingCore
    from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
    from rlgate.spec.multi_agent import spaces_by_agent

    envs = AgentEnvs([MultiAgentCartPole() for _ in range(3)])
    policy = ActingCore.build(multi_agent_spec(), *spaces_by_agent(envs.agent_spaces))
    session = MultiAgentSession(
        MultiAgentSessionSpec("test", envs.agent_spaces, 3, True),
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=8,
        count_steps_by="env_steps",
        lookback=1,
        write_back=policy.write_back,
    )
    steps, taken, shipped = envs.reset(seed=0), 0, []
    for t in range(120):
        episodes, completed = session.observe(steps)
        taken += completed
        if t % 7 == 3:
            shipped += decoded(session.flush())
        outputs = policy.act(episodes, True)
        shipped += decoded(session.record(outputs))
        steps = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
    shipped += decoded(session.close())
    assert sum(chunk.multi_agent_env_steps for chunk in shipped) == taken
    assert sum(len(chunk) for chunk in shipped) >= taken  # two agents per env step while both balance


@pytest.mark.parametrize("bad_env", [0, 1], ids=["first-sub-env", "last-sub-env"])
def test_a_refused_message_records_nothing_of_any_sub_env(examples_importable, bad_env):
    """A message is recorded whole or not at all, as a single-agent one: every sub-env's step is checked before
    any is recorded, and within a sub-env every agent's. Here agent_1 (sorted after agent_0, whose step is fine)
    observes again with no reward for its action in one sub-env; the other sub-env's step is fine."""
    from dataclasses import replace

    from examples.multi_agent_cartpole import MultiAgentCartPole
    from rlgate.core.codec import CodecError
    from rlgate.core.columns import Columns
    from rlgate.envs.agent_envs import AgentEnvs
    from rlgate.policy.acting import ActingCore
    from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
    from rlgate.spec.multi_agent import spaces_by_agent

    envs = AgentEnvs([MultiAgentCartPole() for _ in range(2)])
    policy = ActingCore.build(multi_agent_spec(), *spaces_by_agent(envs.agent_spaces))
    session = MultiAgentSession(
        MultiAgentSessionSpec("test", envs.agent_spaces, 2, True),
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=None,
        count_steps_by="env_steps",
        lookback=1,
        write_back=policy.write_back,
    )
    steps = envs.reset(seed=0)
    for _ in range(3):
        episodes, _ = session.observe(steps)
        outputs = policy.act(episodes, True)
        session.record(outputs)
        steps = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
    assert all(set(step.observations) == {"agent_0", "agent_1"} for step in steps)  # no pole fell in 4 steps
    before = [{a: len(e) for a, e in episode.agent_episodes.items()} for episode in session._episodes]
    env_ts = [episode.env_t for episode in session._episodes]
    rewards = {a: r for a, r in steps[bad_env].rewards.items() if a != "agent_1"}
    steps[bad_env] = replace(steps[bad_env], rewards=rewards)
    with pytest.raises(CodecError, match=rf"^agents\[{bad_env}\]: agent 'agent_1' acted and observed again but got no"):
        session.observe(steps)
    after = [{a: len(e) for a, e in episode.agent_episodes.items()} for episode in session._episodes]
    assert after == before and [episode.env_t for episode in session._episodes] == env_ts
    shipped_chunks = decoded(session.close())  # what the stream's end ships: the steps before the refused message
    assert sum(chunk.multi_agent_env_steps for chunk in shipped_chunks) == sum(env_ts)
    assert sorted(len(chunk) for chunk in shipped_chunks) == [2, 2, 2, 2]  # the third actions had no next obs


@pytest.mark.parametrize("flush_at", [None, 2], ids=["no-flush", "flush-while-a-step-waits"])
def test_a_multi_agent_mean_std_filter_counts_each_observation_once_across_a_flush(flush_at):
    """A pausing server flushes between observe() and the batch: the pipeline runs over the waiting step, then
    again over the cut successor's. Each observation is normalised, and counted in the statistics, once."""
    from rlgate.core.agents_step import AgentsStep
    from rlgate.policy.acting import ActingCore
    from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
    from rlgate.spec.multi_agent import spaces_by_agent

    box = gym.spaces.Box(-100, 100, (1,), np.float32)
    agents = {"a": (box, DISCRETE2)}
    piece = {"type": "MeanStdFilter", "multi_agent": True, "clip_by_value": None}
    spec = RunSpec.parse(
        {"multi_agent": {"policy_mapping_fn": "shared"}, "seed": 0, "connectors": {"env_to_module": [piece]}}, "t"
    )
    policy = ActingCore.build(spec, *spaces_by_agent(agents), seed=0)
    session = MultiAgentSession(
        MultiAgentSessionSpec("t", agents, 1, True),
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=None,
        count_steps_by="env_steps",
        lookback=1,
        write_back=policy.write_back,
    )
    chunks, flags = [], {"__all__": False}
    for t, value in enumerate([10.0, 20.0, 30.0, 40.0]):
        step = AgentsStep({"a": np.array([value], np.float32)}, {} if t == 0 else {"a": 1.0}, dict(flags), dict(flags))
        episodes, _ = session.observe([step])
        if t == flush_at:
            chunks += decoded(session.flush())
        chunks += decoded(session.record(policy.act(episodes, False)))
    chunks += decoded(session.close())
    stats = policy.env_to_module.connectors[0].get_state()["a"]["delta"][0]
    assert stats["count"] == 4 and stats["mean"].tolist() == [25.0]
    observed = {}  # env step -> the observation shipped for it (a cut successor repeats its lookback)
    for chunk in chunks:
        for offset, observation in enumerate(chunk.get_observations()):
            observed.setdefault(chunk.t_started + offset, []).append(round(float(observation[0]), 3))
    assert {t: set(v) for t, v in observed.items()} == {0: {0.0}, 1: {0.707}, 2: {1.0}, 3: {1.162}}


async def test_a_stopping_server_hands_a_multi_agent_session_over_with_no_episode_cut(server_factory, tmp_path):
    """Each sub-env finishes its game, the one it begins after is not recorded, and the answer to the step that ends
    the last one says reconnect: the stop takes one episode's end, and no chunk is cut off (session_closed)."""
    server = await server_factory(spec=multi_agent_spec(), drain_timeout_s=10)
    from examples.multi_agent_cartpole import MultiAgentCartPole

    client = EnvClient([MultiAgentCartPole(num_agents=2) for _ in range(3)], target(server), seed=1)
    async with running_client(client):
        await wait_for_steps(client, 30)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(server.stop(), 10)
        drain_s = asyncio.get_running_loop().time() - started
        assert client.stats.handovers == 1
    assert drain_s < 5
    chunks = [episode_from_proto(c) for c in shipped(tmp_path / "episodes")]
    assert chunks and not any(c.session_closed for c in chunks)
    ended = {c.multi_agent_episode_id for c in chunks if c.multi_agent_episode_chunks}
    assert {c.multi_agent_episode_id for c in chunks} == ended  # every episode shipped ran to its end
