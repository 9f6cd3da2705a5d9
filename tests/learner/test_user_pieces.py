"""User env-to-module pieces keep RLlib's contract through a real server and learner: what a piece writes into the
episodes is what the module acts on, and what the learner trains on.

The pieces are written as RLlib's connector docs write them (tests/support/docs_pieces.py: they rewrite each
episode's latest observation and leave the batch alone), beside an ObservationPreprocessor (one-hot) and frame
stacking. The served module records every observation batch it acts on; the chunks the server shipped to the
learner (kept in its episode files too) must hold exactly those observations (or, stacked, their frames).
"""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from support import recording_module
from support.servers import running_client, shipped, target, until

from rlgate.client.env_client import EnvClient
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.learner.main import LearnerServer

CARTPOLE = {"id": "CartPole-v1"}
CORRIDOR = {"id": "examples.corridor:Corridor", "kwargs": {"length": 6}}
CASES = {
    "docs-add-last-reward": (CARTPOLE, [{"type": "support.docs_pieces:AddLastRewardToObservations"}], [], {}),
    "scale-same-shape": (CARTPOLE, [{"type": "support.docs_pieces:ScaleObservations", "factor": 10.0}], [], {}),
    "one-hot-preprocessor": (CORRIDOR, [{"type": "examples.one_hot:OneHot"}], [], {}),
    "frame-stacking": (
        CARTPOLE,
        [{"type": "FrameStackingEnvToModule", "num_frames": 4}],
        [{"type": "FrameStackingLearner", "num_frames": 4}],
        {"episode_lookback_horizon": 3},  # a chunk carries the frames before its first step
    ),
}


def make_env(env: dict) -> gym.Env:
    if env is CORRIDOR:
        from examples.corridor import Corridor

        return Corridor(**env["kwargs"])
    return gym.make(env["id"])


def module_inputs(chunk: SingleAgentEpisode, stacked: bool) -> np.ndarray:
    """What the module acted on at the chunk's steps (and at its final observation, if the episode ended there;
    else the next chunk's first step is that one): its observations as the chunk holds them, or each step's
    last 4 frames side by side (from the chunk's lookback; zeros before the episode's start)."""
    steps = len(chunk) + (1 if chunk.is_done else 0)
    if not stacked:
        return np.asarray(chunk.get_observations(slice(0, steps)))
    frames = np.asarray(chunk.get_observations(slice(-3, steps), neg_index_as_lookback=True, fill=0.0))
    return np.concatenate([frames[i : i + steps] for i in range(4)], axis=-1)


def rows(array: np.ndarray) -> Counter:
    return Counter(np.asarray(row, np.float32).tobytes() for row in array)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_the_module_acts_and_the_learner_trains_on_what_the_pieces_wrote(
    case, examples_importable, learner_settings, server_factory, tmp_path
):
    env, env_to_module, learner_pieces, sampling = case
    spec = {
        "env": env,
        "model": {"module_class": "support.recording_module:RecordingModule"},
        "connectors": {"env_to_module": env_to_module, "learner": learner_pieces},
        "sampling": sampling,
    }
    learner_server = LearnerServer(learner_settings(env=None, spec=spec))
    await learner_server.start()
    try:
        server = await server_factory(learner=f"127.0.0.1:{learner_server.port}", allow_import=["support", "examples"])
        await until(lambda: server.host.core is not None, timeout=30)
        recording_module.SEEN.clear()  # the probes of building the modules (learner's, server's) are no steps
        vector = gym.vector.SyncVectorEnv([lambda: make_env(env)])
        async with running_client(EnvClient(vector, target(server), seed=0)):
            await until(lambda: server.host.core.version >= 2, timeout=60)  # the learner trained on the pieces' output
        seen = np.concatenate(recording_module.SEEN)
    finally:
        await learner_server.stop()
    observation_space = server.host.core.env_to_module.observation_space
    stacked = env_to_module[0]["type"] == "FrameStackingEnvToModule"
    episodes = [episode_from_proto(message) for message in shipped(tmp_path / "episodes")]
    assert sum(len(episode) for episode in episodes) > 200
    expected = Counter()
    for episode in episodes:
        if not stacked:
            assert np.shape(episode.get_observations(0)) == observation_space.shape  # the pieces' output, not the env's
        expected += rows(module_inputs(episode, stacked))
    assert not expected - rows(seen), "the learner got observations the module never acted on"
    assert sum((rows(seen) - expected).values()) <= 1  # at most the step the client closed on is not shipped
