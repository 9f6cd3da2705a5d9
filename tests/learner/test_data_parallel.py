"""Data-parallel learners (`rlgate learn --num-learners N`): real processes in one gloo group on 127.0.0.1 (NCCL
on two GPUs, where a machine has them).

Two ranks train one model: every update, their weights are identical (the group compares digests after each
update and fails if not), and with one minibatch per epoch they take the very step one learner takes on the
whole batch (same loss parts, same weights, to float tolerance). DQN and SAC: rank 0 samples each update's batch
from its replay buffer and both ranks update on their shares of it, as one learner on the whole batch. Multi-agent
runs (two CartPoles as two agents, a module per agent or one shared) train the same way, module by module. Through
a real server and client, a learner of two ranks publishes versions that change the weights. Bad input is one line
and exit 2; a rank that dies ends the group with one line and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.chunks import decoded
from support.learners import ENV, children, free_port
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.core.columns import Columns
from rlgate.envs.agent_envs import AgentEnvs
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.data_parallel import Group, Rendezvous, Start
from rlgate.learner.follower import build_trainer
from rlgate.learner.multi_agent_trainer import MultiAgentTrainer
from rlgate.learner.off_policy_trainer import OffPolicyTrainer
from rlgate.learner.trainer import Trainer
from rlgate.models import MultiRLModule, load_weights, weights_to_bytes
from rlgate.policy.acting import ActingCore
from rlgate.server.multi_agent_session import MultiAgentSession, MultiAgentSessionSpec
from rlgate.spec.env import run_spaces
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint
from tests.support import warm

OBSERVATION_SPACE = gym.make(ENV).observation_space
ACTION_SPACE = gym.spaces.Discrete(2)
TIMEOUT_S = 30
EXAMPLES = Path(__file__).parents[2] / "examples"


TWO_CARTPOLES = {"id": "examples.multi_agent_cartpole:MultiAgentCartPole"}
#: The runs the trainers' tests train: CartPole, and two CartPoles as two agents with a module each or one shared.
RUNS = {
    "single-agent": {"env": {"id": ENV}},
    "per-agent": {"env": TWO_CARTPOLES, "multi_agent": {"policy_mapping_fn": "per_agent"}},
    "shared": {"env": TWO_CARTPOLES, "multi_agent": {"policy_mapping_fn": "shared"}},
}


def spaces(spec: RunSpec) -> tuple[gym.Space, gym.Space]:
    """The run's env spaces, as rank 0 sends them (multi-agent: Dicts by agent id)."""
    return run_spaces(spec.env, spec.multi_agent is not None, ImportPolicy(spec.modules()))


def trainer(spec: RunSpec, device: str = "cpu") -> Trainer | MultiAgentTrainer | OffPolicyTrainer:
    """The run's trainer as a learner builds it, on `device`; seeded: the same weights, and the same batches sampled."""
    start, imports = Start(spec, *spaces(spec)), ImportPolicy(spec.modules())
    return build_trainer(start, imports, spec.seed, max_staleness=4, device=device)


def two_cartpole_chunks(spec: RunSpec, steps: int, seed: int) -> list[SingleAgentEpisode]:
    """Shipped agent chunks holding at least `steps` agent steps of two CartPoles as two agents, in 2 sub-envs: a
    fresh policy of `spec` acts through a real MultiAgentSession, which cuts running episodes every 16 env steps."""
    from examples.multi_agent_cartpole import MultiAgentCartPole

    envs = AgentEnvs([MultiAgentCartPole() for _ in range(2)])
    policy = ActingCore.build(spec, *spaces(spec), seed=seed)
    session_spec = MultiAgentSessionSpec("test", envs.agent_spaces, envs.num_envs, explore=True)
    session = MultiAgentSession(
        session_spec,
        mapping_fn=policy.mapping_fn,
        rollout_fragment_length=16,
        count_steps_by="env_steps",
        lookback=1,
        write_back=policy.write_back,
    )
    step, chunks = envs.reset(seed=seed), []
    for _ in range(steps + 40):  # each round adds up to 4 agent steps; at most 2 * 2 * 16 wait in running episodes
        episodes, _ = session.observe(step)
        outputs = policy.act(episodes, True)
        chunks += decoded(session.record(outputs))
        if sum(len(c) for c in chunks) >= steps:
            return chunks
        step = envs.step(outputs[Columns.ACTIONS_FOR_ENV])
    raise AssertionError(f"fewer than {steps} agent steps shipped")


def run_chunks(spec: RunSpec, steps: int, seed: int, cartpole_chunks) -> list[SingleAgentEpisode]:
    """Shipped chunks of the run holding at least `steps` (agent) steps."""
    return cartpole_chunks(steps, seed=seed) if spec.multi_agent is None else two_cartpole_chunks(spec, steps, seed)


def one_step_to_train(chunks: list[SingleAgentEpisode]) -> list[SingleAgentEpisode]:
    """The chunks, the last one's module (single-agent: the module) left one step to train on: its other chunks
    gone, and all but the last step of the one kept chosen by a version long gone (stale)."""
    kept = chunks[-1]
    versions = kept.extra_model_outputs[Columns.MODEL_VERSION]
    versions.data = versions.data.copy()  # decoded: read-only
    versions.data[:-1] = -100
    return [c for c in chunks if c.module_id != kept.module_id] + [kept]


def assert_same_stats(ours: dict, theirs: dict, keys: tuple[str, ...] | None = None) -> None:
    """`theirs` (two ranks') hold `ours` (one learner's) to float tolerance: those named in `keys` (None: all of
    ours), and each module's."""
    for key, value in ours.items():
        if key == "modules":
            assert theirs["modules"].keys() == value.keys()
            for module_id, stats in value.items():
                assert_same_stats(stats, theirs["modules"][module_id], keys)
        elif keys is None or key in keys:
            assert theirs[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def assert_same_weights(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    weights = theirs.state_dict()
    for name, weight in ours.state_dict().items():
        torch.testing.assert_close(weights[name], weight, rtol=1e-5, atol=1e-6)


def follower(rendezvous: Rendezvous, rank: int, log: Path, device: str = "cpu", *flags: str) -> warm.Process:
    """`rlgate learn --device DEVICE FLAGS` as rank `rank` of the group: it waits for rank 0 and trains on what it
    sends."""
    with open(log, "w") as out:
        return warm.Process(
            ["learn", "--device", device, "--rendezvous-timeout-s", str(TIMEOUT_S), *flags],
            stdout=out,
            stderr=out,
            env={**os.environ, **rendezvous.env(rank)},
        )


@contextmanager
def two_ranks(log: Path, device: str = "cpu") -> Iterator[Group]:
    """Rank 0 here, with an `rlgate learn` follower as rank 1 (its log to `log`): the group, stopped after the
    block (rank 1 then ends with 0) and closed in any case. `device` "cuda": rank 0 on cuda:0, rank 1 on cuda:1
    (its LOCAL_RANK), over NCCL."""
    rendezvous = Rendezvous(0, 2, "127.0.0.1", free_port())
    rank_1 = follower(rendezvous, 1, log, device)
    group = None
    try:
        group = Group(rendezvous, TIMEOUT_S, torch.device("cuda:0" if device == "cuda" else device))
        yield group
        group.stop()
        assert rank_1.wait(TIMEOUT_S) == 0
    finally:
        if group is not None:
            group.close()
        rank_1.kill()
        rank_1.wait()


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (one per rank)")


@pytest.mark.slow
@pytest.mark.usefixtures("examples_importable")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=TWO_GPUS)])
@pytest.mark.parametrize("run", list(RUNS))
def test_two_ranks_hold_identical_weights_and_take_one_learners_step(
    tmp_path, learner_settings, cartpole_chunks, run, device
):
    # One minibatch per epoch: the two ranks' step on their halves is one learner's on the whole batch. Multi-agent,
    # each module's batch (its agents' steps, of their own number) is cut in halves; a module whose gradients
    # were not all-reduced would differ from one learner (rank 0) or from rank 0 (rank 1: its digest). The last
    # update leaves a module one step to train on: rank 0's shard is that one row, rank 1's none.
    algorithm = {"train_batch_size": 128, "minibatch_size": 512, "num_epochs": 3}
    spec = learner_settings(env=None, spec={**RUNS[run], "algorithm": algorithm}).spec
    with two_ranks(tmp_path / "rank-1.log", device) as group:
        alone, leader = trainer(spec, str(group.device)), trainer(spec, str(group.device))
        assert weights_to_bytes(alone.module) == weights_to_bytes(leader.module)
        group.send_start(spec, *spaces(spec))
        leader.join(group)
        for seed in range(4):
            chunks = run_chunks(spec, 128, seed, cartpole_chunks)
            chunks = one_step_to_train(chunks) if seed == 3 else chunks
            ours, theirs = alone.update(copy.deepcopy(chunks)), leader.update(chunks)  # leader: checks rank 1's weights
            assert_same_stats(ours, theirs, ("policy_loss", "vf_loss", "entropy", "kl", "clip_fraction"))
            assert (ours["env_steps"], ours["stale_steps"]) == (theirs["env_steps"], theirs["stale_steps"])
            assert theirs["scatter_s"] > 0 and theirs["allreduce_s"] > 0 and theirs["check_s"] > 0
            assert_same_weights(alone.module, leader.module)
        fresh = trainer(spec).module
        if isinstance(fresh, MultiRLModule):  # every module trained
            assert len(theirs["modules"]) == len(fresh) == (2 if run == "per-agent" else 1)
            assert all(weights_to_bytes(leader.module[m]) != weights_to_bytes(fresh[m]) for m in fresh)
        assert weights_to_bytes(leader.module) != weights_to_bytes(fresh)  # it trained
    log = (tmp_path / "rank-1.log").read_text()
    assert "rank 0 stopped the group after 4 updates" in log
    assert ("(nccl, cuda:1)" if device == "cuda" else "(gloo, cpu)") in log


# Beyond the weights, the test compares DQN's priorities (a prioritized buffer) and SAC's temperature. SAC on
# CartPole is discrete SAC: expectations over the actions, no sampled noise (each rank draws its own).
REPLAYED = {
    "DQN": {"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer"}, "tau": 0.5},
    "SAC": {"tau": 0.5, "initial_alpha": 0.5},
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=TWO_GPUS)])
@pytest.mark.parametrize("algorithm", ["DQN", "SAC"])
@pytest.mark.parametrize("run", ["single-agent", "per-agent"])
@pytest.mark.slow
@pytest.mark.usefixtures("examples_importable")
def test_two_ranks_replay_and_update_as_one_learner(
    tmp_path, learner_settings, cartpole_chunks, algorithm, run, device
):
    # A train batch of 63 rows: shards of 32 and 31, so gradients and losses weighted other than by rows would
    # differ from one learner's; a rank that skipped an all-reduce would differ from one learner (rank 0) or from
    # rank 0 (rank 1: its digest). Two updates per version, the targets moved after each. Rank 0 has trained a
    # version before the group forms (as a resumed learner has): rank 1 takes its optimizers' moments too.
    # Per agent: each update trains both modules, each on a batch from its own replay buffer.
    fields = {"name": algorithm, "train_batch_size": 63, "training_intensity": 63.0, "broadcast_interval": 2}
    fields |= {"num_steps_sampled_before_learning_starts": 0, "target_network_update_freq": 0, **REPLAYED[algorithm]}
    model = {"config": {"fcnet_hiddens": [32, 32]}}
    spec = learner_settings(env=None, spec={**RUNS[run], "algorithm": fields, "model": model}).spec
    with two_ranks(tmp_path / "rank-1.log", device) as group:
        alone, leader = trainer(spec, str(group.device)), trainer(spec, str(group.device))
        assert isinstance(alone, OffPolicyTrainer) and isinstance(leader, OffPolicyTrainer)
        chunks = run_chunks(spec, 64, 3, cartpole_chunks)
        alone.update(copy.deepcopy(chunks))
        leader.update(chunks)
        group.send_start(spec, *spaces(spec))
        leader.join(group)
        for seed in range(3):
            chunks = run_chunks(spec, 64, seed, cartpole_chunks)
            ours, theirs = alone.update(copy.deepcopy(chunks)), leader.update(chunks)  # leader: checks rank 1's
            assert ours["updates"] == theirs["updates"] == 2
            assert_same_stats(ours, theirs)
            assert theirs["scatter_s"] > 0 and theirs["allreduce_s"] > 0 and theirs["check_s"] > 0
            assert_same_weights(alone._everything(), leader._everything())  # modules, targets, SAC's temperature
            assert len(leader.parts) == (2 if run == "per-agent" else 1)
            for module_id, part in alone.parts.items():  # DQN: the priorities from rank 0's gathered TD errors
                replayed = leader.parts[module_id].buffer.get_state()[0]
                for name, array in part.buffer.get_state()[0].items():
                    np.testing.assert_allclose(replayed[name], array, rtol=1e-5, atol=1e-6)
        assert alone.version == leader.version == 4
    assert "rank 0 stopped the group after 6 updates" in (tmp_path / "rank-1.log").read_text()


def test_a_follower_whose_rank_0_is_gone_ends_with_one_line(tmp_path, learner_settings):
    spec = learner_settings().spec
    rendezvous = Rendezvous(0, 2, "127.0.0.1", free_port())
    rank_1 = follower(rendezvous, 1, tmp_path / "rank-1.log")
    try:
        group = Group(rendezvous, TIMEOUT_S)
        group.send_start(spec, OBSERVATION_SPACE, ACTION_SPACE)
        trainer(spec).join(group)
        group.close()  # as a killed rank 0's connections close: rank 1 waits for the next update there
        assert rank_1.wait(TIMEOUT_S) == 1
    finally:
        rank_1.kill()
        rank_1.wait()
    log = (tmp_path / "rank-1.log").read_text()
    assert "Traceback" not in log
    assert "learner rank 1 of 2: the group broke: " in log.splitlines()[-1]
    assert "the learner stops: restart it, it resumes from its last checkpoint" in log.splitlines()[-1]


@pytest.mark.slow
def test_an_idle_rank_0s_heartbeats_keep_a_follower_past_its_collective_timeout_and_it_ends_when_they_stop(
    tmp_path, learner_settings
):
    """Rank 0 without data sends heartbeats, so a follower waits for its next update longer than a collective may
    take; a rank 0 that hangs (or, under NCCL, dies without closing anything) sends none, and the follower ends
    within that timeout with one line, instead of waiting for ever."""
    timeout_s = 3.0
    spec = learner_settings().spec
    rendezvous = Rendezvous(0, 2, "127.0.0.1", free_port())
    rank_1 = follower(rendezvous, 1, tmp_path / "rank-1.log", "cpu", "--collective-timeout-s", str(timeout_s))
    try:
        group = Group(rendezvous, TIMEOUT_S, collective_timeout_s=timeout_s)
        group.send_start(spec, OBSERVATION_SPACE, ACTION_SPACE)
        trainer(spec).join(group)
        idle_until = time.monotonic() + 3 * timeout_s  # idle for three timeouts: the time passing is the test's input
        while time.monotonic() < idle_until and rank_1.poll() is None:
            time.sleep(group.heartbeat_s)
            group.keep_alive()
        assert rank_1.poll() is None, (tmp_path / "rank-1.log").read_text()  # the heartbeats kept it waiting
        assert rank_1.wait(TIMEOUT_S) == 1  # no heartbeat any more: rank 0 "hangs"
        group.close()
    finally:
        rank_1.kill()
        rank_1.wait()
    last = (tmp_path / "rank-1.log").read_text().splitlines()[-1]
    assert "learner rank 1 of 2: the group broke: " in last and "the learner stops: restart it" in last, last


@pytest.mark.slow
async def test_a_rank_that_dies_ends_rank_0_with_one_line_and_exit_1(tmp_path, learners):
    learner = learners.start("learner", "--num-learners", "2", *QUICK)
    log = tmp_path / "learner.log"
    await until(lambda: "learning grpc=" in log.read_text(), timeout=TIMEOUT_S)
    (rank_1,) = children(learner.pid)
    os.kill(rank_1, signal.SIGKILL)
    assert await asyncio.to_thread(learner.wait, TIMEOUT_S) == 1
    last = log.read_text().splitlines()[-1]
    assert "CRITICAL" in last and "learner rank 1 of 2 exited with status -9; the learner stops" in last


@pytest.mark.slow
async def test_an_idle_learner_of_two_ranks_outlives_its_collective_timeout(tmp_path, learners):
    """No server, no data: rank 0's heartbeats (its own task) keep its follower waiting; without them the follower
    would end after 2 s, and rank 0 with it (exit 1)."""
    learner = learners.start("learner", "--num-learners", "2", "--collective-timeout-s", "2")
    log = tmp_path / "learner.log"
    await until(lambda: "learning grpc=" in log.read_text(), timeout=TIMEOUT_S)
    idle_until = time.monotonic() + 3 * 2  # idle for three timeouts: the time passing is the test's input
    while time.monotonic() < idle_until:
        assert learner.poll() is None, log.read_text()
        await asyncio.sleep(0.25)
    learner.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(learner.wait, TIMEOUT_S) == 0, log.read_text()
    assert "the group broke" not in log.read_text()


@pytest.mark.slow
async def test_followers_beside_rank_0_leave_its_http_port_to_it(tmp_path, learners, http_get, monkeypatch):
    """As in one container of compose (RLGATE_HTTP_PORT set for every process there): the ranks rank 0 starts on
    its host read that port too, and serve no HTTP (only a rank with a host of its own does), so rank 0 gets it."""
    port = free_port()
    monkeypatch.setenv("RLGATE_HTTP_PORT", str(port))  # the followers' environment
    learner = learners.start("learner", "--num-learners", "2", "--http-port", str(port))
    await until(lambda: "learning grpc=" in (tmp_path / "learner.log").read_text(), timeout=TIMEOUT_S)
    code, body = await http_get(port, "/status")
    assert code == 200 and "model_version" in body  # rank 0's, not a follower's
    learner.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(learner.wait, TIMEOUT_S) == 0


QUICK = ("--spec.algorithm.train-batch-size", "128", "--spec.algorithm.minibatch-size", "64")
QUICK += ("--spec.algorithm.num-epochs", "2", "--spec.sampling.rollout-fragment-length", "16")


# DQN: an update per 4 env steps sampled after the first 64, a version per 2 updates.
DQN_QUICK = ("--algo", "DQN", "--spec.algorithm.train-batch-size", "32", "--spec.algorithm.broadcast-interval", "2")
DQN_QUICK += ("--spec.algorithm.num-steps-sampled-before-learning-starts", "64")
DQN_QUICK += ("--spec.sampling.rollout-fragment-length", "16")


# Two CartPoles as two agents, a module each (PPO).
PER_AGENT = ("--config", str(EXAMPLES / "multi_agent_cartpole.toml"))
PER_AGENT += ("--spec.multi-agent.policy-mapping-fn", "per_agent")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "env_steps"),
    [(QUICK, 4 * 128), (DQN_QUICK, 64 + 4 * 2 * 4), ((*PER_AGENT, *QUICK), 4 * 128)],
    ids=["PPO", "DQN", "multi-agent-PPO"],
)
async def test_two_learners_train_through_a_real_server_and_client(
    tmp_path, learners, server_factory, examples_importable, flags, env_steps
):
    from examples.multi_agent_cartpole import MultiAgentCartPole

    server = await server_factory(learner=learners.target)
    multi_agent = "--config" in flags
    learner = learners.start("learner", "--num-learners", "2", *flags, env=None if multi_agent else ENV)
    if multi_agent:
        envs = [MultiAgentCartPole() for _ in range(2)]
    else:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)])
    client = EnvClient(envs, target(server), seed=0, inference="server")
    async with running_client(client):
        await until(lambda: server.host.core is not None and server.host.core.version >= 4, timeout=60)
    await server.stop()
    learner.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(learner.wait, TIMEOUT_S) == 0
    log = (tmp_path / "learner.log").read_text()
    assert "learner rank 1 of 2 joined" in log
    assert "rank 0 stopped the group after" in log
    final = checkpoint.load(learners.checkpoints)
    assert final.version >= 4 and final.env_steps >= env_steps
    fresh, trained = trainer(final.spec).module, trainer(final.spec).module
    if isinstance(fresh, MultiRLModule) and isinstance(trained, MultiRLModule):  # each module's weights
        assert final.module_weights is not None and final.module_weights.keys() == set(fresh)
        pairs = [(fresh[m], trained[m], final.module_weights[m]) for m in fresh]
    else:
        pairs = [(fresh, trained, final.weights)]
    with final.loading_weights():
        for _, module, weights in pairs:
            load_weights(module, weights)
    assert all(weights_to_bytes(module) != weights_to_bytes(before) for before, module, _ in pairs)  # each trained


def rlgate_learn(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`rlgate learn FLAGS` to its end, forked warm (tests/support/warm.py)."""
    code, out, err = warm.run(["learn", *flags], warm.ROOT, TIMEOUT_S, env={**os.environ, **(env or {})})
    return subprocess.CompletedProcess(["rlgate", "learn", *flags], code, out, err)


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--env", ENV, "--num-learners", "5", "--spec.algorithm.minibatch-size", "4"),
            "--num-learners 5: more learners than the 4 env steps of a minibatch (--spec.algorithm.minibatch-size, "
            "--spec.algorithm.train-batch-size): each needs at least one",
        ),
        (
            ("--env", ENV, "--num-learners", "5", "--algo", "SAC", "--spec.algorithm.train-batch-size", "4"),
            "--num-learners 5: more learners than the 4 transitions of a train batch "
            "(--spec.algorithm.train-batch-size): each needs at least one",
        ),
    ],
    ids=["more-than-a-minibatch", "more-than-a-train-batch"],
)
@pytest.mark.slow
def test_learners_the_run_cannot_have_are_one_line_and_exit_2(tmp_path, flags, line):
    done = rlgate_learn("--port", "0", "--http-port", "0", "--checkpoint-dir", str(tmp_path), *flags)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"rlgate: {line}"


@pytest.mark.slow
def test_a_rank_that_cannot_reach_the_rendezvous_is_one_line_and_exit_2():
    nobody = Rendezvous(1, 2, "127.0.0.1", free_port())  # no rank 0 listens there
    done = rlgate_learn("--rendezvous-timeout-s", "1", env=nobody.env(1))
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"rlgate: learner rank 1 of 2: the group did not form at 127.0.0.1:{nobody.port} within 1 s")
    assert "Traceback" not in done.stderr
