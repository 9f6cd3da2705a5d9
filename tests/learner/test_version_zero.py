"""A server given the learner's run spec in advance (`--config` beside `--learner`, as `rlgate up` does) serves
its version 0 at once, built from the spec's seed exactly as the learner builds it, and samples no more than
the learner's pacing allows until the learner is up; then it takes the learner's weights as usual. A spec
that differs from the learner's is refused (and what the server samples with it never reaches the learner),
and one without a seed is a user error."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from support.learners import ENV, free_port
from support.servers import running_client, target, until

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer
from rlgate.models import weights_to_bytes
from rlgate.spec.imports import SpecError
from rlgate.spec.run import RunSpec

SPEC = {
    "env": {"id": ENV, "num_envs": 4},
    "algorithm": {"train_batch_size": 64, "minibatch_size": 64, "num_epochs": 2},
    "sampling": {"rollout_fragment_length": 16},
    "seed": 3,
}


def spec_file(tmp_path, spec: RunSpec) -> str:
    """The spec as `rlgate up` writes it for its processes: whole (the preset's values too)."""
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    return str(path)


def cartpole_client(server) -> EnvClient:
    return EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV) for _ in range(4)]), target(server), seed=0)


async def test_version_0_is_served_before_the_learner_is_up_and_is_the_learners(
    tmp_path, learner_settings, server_factory
):
    port = free_port()  # the learner comes later, on this port
    settings = learner_settings(port=port, spec=SPEC)
    server = await server_factory(learner=f"127.0.0.1:{port}", config=spec_file(tmp_path, settings.spec))
    assert server.host.core is not None and server.host.core.version == 0 and not server.host.from_learner
    learner = LearnerServer(settings)
    assert weights_to_bytes(server.host.core.module) == weights_to_bytes(learner.learner.trainer.module)  # its v0
    window = settings.spec.algorithm.max_unacked_steps(servers=1)
    assert server.learner.window == window == 32
    try:
        async with running_client(cartpole_client(server)) as client:
            # No learner yet: the client steps, and the server pauses once the learner's window is shipped.
            await until(lambda: server.host.batcher.pause_reason() is not None, timeout=30)
            assert window <= server.learner.unacked_steps() < window + 64  # a pause ships the running episodes
            await learner.start()
            await until(lambda: server.host.core.version >= 2, timeout=60)  # trains on what the server sampled
            assert server.host.from_learner and server.host.refused is None
            assert not client.done()
    finally:  # after the client: a server without its learner pauses, and the client's last step would wait
        await learner.stop()


@pytest.mark.slow
async def test_a_learner_with_another_run_spec_is_refused_and_says_so(
    tmp_path, learner_settings, server_factory, http_get
):
    port = free_port()
    spec = learner_settings(spec=SPEC).spec
    # A drain of 1 s: its stop waits out the drain twice (sessions, then acks), and no ack can come here.
    server = await server_factory(learner=f"127.0.0.1:{port}", config=spec_file(tmp_path, spec), drain_timeout_s=1.0)
    learner = LearnerServer(learner_settings(port=port, spec={**SPEC, "seed": 4}))
    try:
        async with running_client(cartpole_client(server)) as client:
            # Before the learner is up, the server samples with its own version 0 and spools the steps.
            await until(lambda: server.learner.unacked_steps() > 0, timeout=30)
            await learner.start()
            await until(lambda: server.host.refused is not None, timeout=30)
            assert "the learner runs another run spec than --config's" in server.host.refused
            status, body = await http_get(server.http_port, "/readyz")
            assert status == 503 and "--config's" in json.loads(body)["reason"]
            assert server.host.core.version == 0 and not server.host.from_learner

            # Steps sampled by another model never reach the learner: neither those spooled before it came nor
            # any since. Unacknowledged, they fill the window and pause sampling, which the server's report to
            # the learner says (over the same channel: the link has been talking to the learner all along).
            def reported_paused() -> bool:
                return any(s["paused"] for s in learner.learner.servers.connected())

            await until(reported_paused, timeout=30)
            assert learner.learner.chunks_accepted == 0 and server.learner.unacked_steps() > 0
            assert not client.done()
            await server.stop()  # its paused client's last step is answered by the stop, not by the learner
    finally:
        await learner.stop()


async def test_the_learners_spec_given_in_advance_needs_a_seed(tmp_path, server_factory):
    with pytest.raises(SpecError, match="needs a seed"):
        await server_factory(learner="127.0.0.1:1", config=spec_file(tmp_path, RunSpec(**{**SPEC, "seed": None})))
    with pytest.raises(SpecError, match="--env describes a fresh model"):
        await server_factory(learner="127.0.0.1:1", env=ENV)
