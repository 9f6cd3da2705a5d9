"""Micro benchmark of the episode wire codec: encode + decode of a 500-step CartPole episode.

The episode has the extra model outputs a server records for it (action_logp, action_dist_inputs [2],
model_version). Encode is
`episode_to_proto` + `SerializeToString`, decode is `Episode.FromString` + `episode_from_proto` (always
into numpy mode). Encoding a list-mode episode (the server's) includes stacking its per-step items
into arrays, the work RLlib does in `to_numpy()`. Also measures `add_env_step` per call.
Run: `.venv/bin/python -m rlgate.bench.episodes_codec`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto, episode_to_proto
from rlgate.v1 import episode_pb2

OBSERVATION_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


def cartpole_episode(steps: int = 500, seed: int = 0) -> SingleAgentEpisode:
    """A list-mode episode of `steps` steps whose items are row views of batched arrays, as the
    server's batched forward pass hands them out."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((steps + 1, 4), dtype=np.float32)
    actions = rng.integers(0, 2, steps)
    logits = rng.standard_normal((steps, 2), dtype=np.float32)
    episode = SingleAgentEpisode(observation_space=OBSERVATION_SPACE, action_space=ACTION_SPACE)
    episode.add_env_reset(obs[0])
    for t in range(steps):
        episode.add_env_step(obs[t + 1], actions[t], 1.0, extra_model_outputs=_outputs(logits[t]))
    return episode


def _outputs(logits: np.ndarray) -> dict[str, object]:
    return {
        Columns.ACTION_LOGP: np.float32(-0.69),
        Columns.ACTION_DIST_INPUTS: logits,
        Columns.MODEL_VERSION: np.int64(3),
    }


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _add_env_step_us(steps: int = 2000) -> float:
    """Median over repeats of the mean cost of one list-mode add_env_step with 3 extra outputs."""
    obs = np.zeros((1, 4), np.float32)[0]
    outputs = _outputs(np.zeros(2, np.float32))

    def fill() -> None:
        episode = SingleAgentEpisode()
        episode.add_env_reset(obs)
        for _ in range(steps):
            episode.add_env_step(obs, 1, 1.0, extra_model_outputs=outputs)

    return _median_us(fill, 20) / steps


def run(steps: int = 500, repeats: int = 300) -> dict[str, float]:
    """Median microseconds of encode, decode and their total, for the server's list-mode episode and
    for a numpy-mode one (as RLlib ships them after to_numpy()); plus message size and add_env_step cost.
    """
    episode = cartpole_episode(steps)
    numpy_episode = cartpole_episode(steps).to_numpy()
    data = episode_to_proto(episode).SerializeToString()

    def decode() -> SingleAgentEpisode:
        return episode_from_proto(episode_pb2.Episode.FromString(data), OBSERVATION_SPACE, ACTION_SPACE)

    encode_us = _median_us(lambda: episode_to_proto(episode).SerializeToString(), repeats)
    encode_numpy_us = _median_us(lambda: episode_to_proto(numpy_episode).SerializeToString(), repeats)
    decode_us = _median_us(decode, repeats)
    return {
        "steps": steps,
        "encode_us": round(encode_us, 1),
        "decode_us": round(decode_us, 1),
        "total_us": round(encode_us + decode_us, 1),
        "encode_numpy_episode_us": round(encode_numpy_us, 1),
        "total_numpy_episode_us": round(encode_numpy_us + decode_us, 1),
        "message_bytes": len(data),
        "add_env_step_us": round(_add_env_step_us(), 2),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
