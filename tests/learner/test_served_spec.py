"""The learner's run spec is what servers serve: built from the weights message alone, refused where its code
may not be imported, and kept in checkpoints that a server serves with nothing else."""

from __future__ import annotations

import asyncio
import copy
import json

import grpc
import gymnasium as gym
import numpy as np
import torch
from support.batches import episode_batch
from support.servers import RawStream, hello, running_client, step, target, until

from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.main import LearnerServer
from rlgate.spec.build import build_module_to_env
from rlgate.spec.imports import ImportPolicy
from rlgate.v1 import learner_pb2_grpc

CORRIDOR = {
    "env": {"id": "examples.corridor:Corridor", "kwargs": {"length": 6}},
    "connectors": {
        "env_to_module": [{"type": "examples.one_hot:OneHot"}],
        "learner": [{"type": "examples.scale_rewards:ScaleRewards", "factor": 2.0}],
    },
}


async def test_a_server_with_only_the_learners_address_serves_the_learners_pieces(
    examples_importable, learner_settings, server_factory
):
    from examples.corridor import Corridor

    learner_server = LearnerServer(learner_settings(env=None, spec=CORRIDOR))
    await learner_server.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", allow_import=["examples"])
        env = gym.vector.SyncVectorEnv([lambda: Corridor(length=6)] * 4)
        async with running_client(EnvClient(env, target(server), seed=0)):
            await until(lambda: server.host.core is not None and server.host.core.version >= 2, timeout=60)
        assert server.host.core.spec == learner_server.learner.spec
        assert server.host.core.env_to_module[0].name == "OneHot"  # the learner's piece, from the learner's spec
        assert server.host.core.env_to_module.observation_space == gym.spaces.Box(0.0, 1.0, (6,), np.float32)
    finally:
        await learner_server.stop()


async def test_a_server_not_allowed_to_import_the_specs_code_serves_nothing_and_says_why(
    examples_importable, learner_settings, server_factory, http_get
):
    learner_server = LearnerServer(learner_settings(env=None, spec=CORRIDOR))
    await learner_server.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
        await until(lambda: server.host.refused is not None, timeout=30)
        status, body = await http_get(server.http_port, "/readyz")
        assert status == 503 and "--allow-import examples" in json.loads(body)["reason"]
        raw = RawStream(server)
        try:
            await raw.send(hello(gym.spaces.Discrete(6), gym.spaces.Discrete(2)))
            code, details = await raw.status()
        finally:
            await raw.close()
        assert code == grpc.StatusCode.UNAVAILABLE and "may not import" in details and "examples" in details
        assert server.host.core is None  # nothing was built, nothing half-built is served
    finally:
        await learner_server.stop()


async def test_a_checkpoint_served_alone_acts_as_the_learners_module_with_its_pieces(
    learner_settings, server_factory, tmp_path
):
    """Trained with MeanStdFilter + FrameStacking; the checkpoint server's greedy actions on a fresh episode equal
    those of the learner's own module and env-to-module pipeline (statistics included) on the same observations."""
    spec = {
        "connectors": {
            "env_to_module": ["MeanStdFilter", {"type": "FrameStackingEnvToModule", "num_frames": 3}],
            "learner": [{"type": "FrameStackingLearner", "num_frames": 3}],
        },
        "sampling": {"rollout_fragment_length": 16, "episode_lookback_horizon": 2},
    }
    learner_server = LearnerServer(learner_settings(spec=spec))
    await learner_server.start()
    try:
        trainer_fed = await server_factory(learner=f"127.0.0.1:{learner_server.port}")
        env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
        async with running_client(EnvClient(env, target(trainer_fed), seed=0)):
            await until(lambda: trainer_fed.host.core is not None and trainer_fed.host.core.version >= 3, timeout=60)
        await trainer_fed.stop()
    finally:
        await learner_server.stop()  # writes the final checkpoint
    learner = learner_server.learner
    pipeline, module = copy.deepcopy(learner.connectors), copy.deepcopy(learner.trainer.module)
    to_env = build_module_to_env(learner.spec, learner.observation_space, learner.action_space, ImportPolicy())

    served = await server_factory(checkpoint=learner_settings().checkpoint_dir, port=0)
    assert served.host.core.version == learner.trainer.version
    cartpole = gym.make("CartPole-v1")
    obs, _ = cartpole.reset(seed=11)
    episode = SingleAgentEpisode(observation_space=learner.observation_space, action_space=learner.action_space)
    episode.add_env_reset(obs)
    raw = RawStream(served)
    try:
        await raw.send(hello(learner.observation_space, learner.action_space, explore=False))
        await raw.recv()  # welcome
        reward, terminated = 0.0, False
        for _ in range(40):
            await raw.send(step(obs[None], reward=np.array([reward]), terminated=np.array([terminated])))
            action = int(codec.from_value((await raw.recv()).actions.actions, "actions")[0])
            batch = pipeline(rl_module=module, batch={}, episodes=[episode], explore=False, shared_data={})
            with torch.inference_mode():
                out = module.forward_inference(batch)
            expected = to_env(rl_module=module, batch=out, episodes=[episode], explore=False, shared_data={})
            assert action == int(np.asarray(expected[Columns.ACTIONS_FOR_ENV]).reshape(-1)[0])
            obs, reward, terminated, truncated, _ = cartpole.step(action)
            if terminated or truncated:
                break
            episode.add_env_step(obs, action, reward)
    finally:
        await raw.close()


async def test_a_learner_piece_that_raises_fails_its_update_not_the_learner(
    learner_settings, cartpole_chunks, tmp_path, monkeypatch
):
    (tmp_path / "boom.py").write_text(
        "from rlgate.connectors import ConnectorV2\n"
        "class Boom(ConnectorV2):\n"
        "    def __call__(self, **kwargs):\n"
        "        raise RuntimeError('a bug in a user piece')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    learner_server = LearnerServer(learner_settings(spec={"connectors": {"learner": [{"type": "boom:Boom"}]}}))
    await learner_server.start()
    learner = learner_server.learner
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{learner_server.port}") as channel:
            call = learner_pb2_grpc.LearnerServiceStub(channel).SubmitEpisodes()
            for seq in (1, 2):
                chunks = cartpole_chunks(learner.spec.algorithm.train_batch_size, seed=seq)
                await call.write(episode_batch(chunks, seq))
                assert (await asyncio.wait_for(call.read(), 30)).accepted == len(chunks)  # still taking data
                await until(lambda s=seq: failed_updates(learner) == s, timeout=30)
            await call.done_writing()
        assert learner.trainer.version == 0 and learner.status_message().model_version == 0
    finally:
        await learner_server.stop()


def failed_updates(learner) -> float | None:
    return learner.metrics.registry.get_sample_value("rlgate_learner_failed_updates_total")
