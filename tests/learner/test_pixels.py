"""Image observations end to end: uint8 frames from the env client to the module, on the server and the learner,
one frame per step on the wire and in the episodes, stacked by the FrameStacking pieces on both sides."""

from __future__ import annotations

import gymnasium as gym
import torch
from support.observed_module import ObservedModule
from support.pixel_env import SHAPE, Frames
from support.servers import running_client, shipped, target, until

from rlgate.client.env_client import EnvClient
from rlgate.learner.main import LearnerServer
from rlgate.v1 import tensor_pb2

FRAMES = 4
PIXELS = {
    "env": {"id": "support.pixel_env:Frames", "num_envs": 4},
    "model": {"module_class": "support.observed_module:ObservedModule"},
    "connectors": {
        "env_to_module": [{"type": "FrameStackingEnvToModule", "num_frames": FRAMES}],
        "learner": [{"type": "FrameStackingLearner", "num_frames": FRAMES}],
    },
    # Chunks of 16 steps from 40-step episodes: stacks across a cut need the 3 frames of lookback.
    "sampling": {"rollout_fragment_length": 16, "episode_lookback_horizon": FRAMES - 1},
}


def stacks_of_frames_in_order(pixels: torch.Tensor) -> bool:
    """Whether every row [channels] is a stack of consecutive Frames frames, oldest first: frame t holds t + 1, so
    the newest value v comes after v - 1, v - 2, ..., and zeros (the padding) only before an episode's start."""
    newest = pixels[:, -1].long()
    expected = (newest[:, None] - torch.arange(FRAMES - 1, -1, -1)).clamp(min=0)
    return bool((newest >= 1).all() and (pixels.long() == expected).all())


async def test_frames_stay_uint8_from_the_env_to_the_module_on_server_and_learner(
    learner_settings, server_factory, tmp_path
):
    ObservedModule.seen.clear()
    learner_server = LearnerServer(learner_settings(env=None, spec=PIXELS))
    await learner_server.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", allow_import=["support"])
        env = gym.vector.SyncVectorEnv([Frames] * 4)
        async with running_client(EnvClient(env, target(server), seed=0)):
            await until(lambda: learner_server.learner.progress.updates.total >= 2, timeout=60)
        await server.stop()
    finally:
        await learner_server.stop()
    # Every batch of the pipelines has a row per sub-env (4) or per minibatch step (64); the one-row forwards are
    # the module's build-time check of its outputs, on a sampled observation (models.outputs.output_shapes).
    batches = [seen for seen in ObservedModule.seen if seen[2][0] > 1]
    sampled = [seen for seen in batches if seen[0] == "sample"]
    trained = [seen for seen in batches if seen[0] == "train"]
    assert sampled and trained
    stacked = (*SHAPE[:2], SHAPE[2] * FRAMES)
    for forward, dtype, shape, pixels in sampled + trained:
        assert dtype == torch.uint8 and shape[1:] == stacked, (forward, dtype, shape)
        assert stacks_of_frames_in_order(pixels), (forward, pixels)
    # On the wire to the learner and in the episodes: one uint8 frame per step, not a stack.
    chunks = shipped(tmp_path / "episodes")
    assert chunks
    for chunk in chunks:
        tensor = chunk.observations.tensor
        assert (tensor.dtype, tuple(tensor.shape[1:])) == (tensor_pb2.DTYPE_UINT8, SHAPE), tensor.shape
