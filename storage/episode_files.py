"""Recorded episodes on disk (`rlgate serve --episode-dir DIR`): what they are, and reading them back.

`DIR/<episode id>-<chunk index>.pb` holds one chunk as an `rlgate.v1.Episode` (long episodes are cut into
chunks, each with `t_started`, `chunk_index` and a lookback). `DIR/metadata.json` says how to read them,
in plain JSON: the space the stored observations are in (what the env-to-module pipeline's write-back
pieces, e.g. MeanStdFilter, left; else the env's), the env's spaces, the env id and the run spec, and the
rlgate version that wrote them. One directory holds one kind of data: a recorder whose spaces differ from a
directory's metadata writes into a fresh subfolder instead. `read_episodes(DIR)` yields the chunks as
`SingleAgentEpisode`s (e.g. for offline RL); `summarize(DIR)` (`rlgate episodes DIR`) describes them.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from google.protobuf.message import DecodeError

from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import episode_from_proto
from rlgate.spec.run import RunSpec
from rlgate.v1 import episode_pb2

METADATA = "metadata.json"


@dataclass(frozen=True)
class Recording:
    """What a directory of episode files holds."""

    observation_space: gym.Space  # of the stored observations
    action_space: gym.Space
    env_observation_space: gym.Space | None = None
    spec: RunSpec | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "observation_space": codec.space_to_json(self.observation_space),
            "action_space": codec.space_to_json(self.action_space),
            "env_observation_space": (
                None if self.env_observation_space is None else codec.space_to_json(self.env_observation_space)
            ),
            "env_id": self.spec.env.id if self.spec else None,
            "spec": self.spec.model_dump(mode="json") if self.spec else None,
            "rlgate_version": importlib.metadata.version("rlgate"),
        }

    def same_data(self, other: Recording) -> bool:
        """Whether episodes of both can share a directory (stored observations and actions alike)."""
        return (self.observation_space, self.action_space) == (other.observation_space, other.action_space)


def write_metadata(directory: Path, recording: Recording) -> None:
    """Write `directory/metadata.json` (atomically)."""
    tmp = directory / f".{METADATA}"
    tmp.write_text(json.dumps(recording.to_json(), indent=2))
    tmp.replace(directory / METADATA)


def read_metadata(directory: Path) -> Recording | None:
    """The directory's metadata, or None when it has none. ValueError for a metadata.json that is not one."""
    path = directory / METADATA
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        env_space = data.get("env_observation_space")
        return Recording(
            observation_space=codec.space_from_json(data["observation_space"], "observation_space"),
            action_space=codec.space_from_json(data["action_space"], "action_space"),
            env_observation_space=None if env_space is None else codec.space_from_json(env_space),
            spec=None if data.get("spec") is None else RunSpec.parse(data["spec"], str(path)),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not rlgate episode metadata: {exc}") from exc


def episode_files(directory: Path) -> list[Path]:
    """The chunk files, in order: by episode id, then chunk index."""

    def key(path: Path) -> tuple[str, int]:
        episode_id, _, chunk = path.stem.rpartition("-")
        return episode_id, int(chunk) if chunk.isdigit() else -1

    return sorted(directory.glob("*.pb"), key=key)


def read_episodes(directory: str | Path) -> Iterator[SingleAgentEpisode]:
    """Every recorded chunk as a numpy-mode SingleAgentEpisode with the recorded spaces, chunks of one
    episode one after another (`chunk_index` 0, 1, ...). ValueError for a directory with no metadata.json
    (recorded before rlgate wrote it) or a file that is not an episode."""
    directory = Path(directory)
    recording = _recording(directory)
    for path in episode_files(directory):
        try:
            message = episode_pb2.Episode.FromString(path.read_bytes())
            yield episode_from_proto(message, recording.observation_space, recording.action_space)
        except (ValueError, DecodeError) as exc:  # CodecError is a ValueError; protobuf's DecodeError is not
            raise ValueError(f"{path}: {' '.join(str(exc).split())}") from exc


def summarize(directory: str | Path) -> dict[str, Any]:
    """What a directory of episode files holds: counts, env steps, the returns and lengths of the episodes
    recorded to their end in the env, the model versions that acted, the env and its spaces."""
    directory = Path(directory)
    recording = _recording(directory)
    chunks = steps = 0
    totals: dict[str, tuple[float, int]] = {}  # episode id -> return and length so far
    finished: list[tuple[float, int]] = []
    terminated = 0
    versions: list[int] = []
    for episode in read_episodes(directory):
        chunks += 1
        steps += len(episode)
        total, length = totals.get(episode.id_, (0.0, 0))
        totals[episode.id_] = (total + episode.get_return(), length + len(episode))
        if episode.is_done and not episode.session_closed:  # cut off as its client left: not finished
            finished.append(totals[episode.id_])
            terminated += episode.is_terminated
        if Columns.MODEL_VERSION in episode.extra_model_outputs and len(episode):
            versions += episode.get_extra_model_outputs(Columns.MODEL_VERSION, slice(0, len(episode))).tolist()
    returns = [r for r, _ in finished]
    lengths = [n for _, n in finished]
    return {
        "directory": str(directory),
        "env_id": recording.spec.env.id if recording.spec else None,
        "observation_space": str(recording.observation_space),
        "action_space": str(recording.action_space),
        "chunks": chunks,
        "episodes": len(totals),
        "finished_episodes": len(finished),  # terminated, or truncated by the env (not cut off as its client left)
        "terminated_episodes": terminated,
        "env_steps": steps,
        "return_mean": float(np.mean(returns)) if returns else None,
        "return_min": min(returns, default=None),
        "return_max": max(returns, default=None),
        "length_mean": float(np.mean(lengths)) if lengths else None,
        "model_versions": [min(versions), max(versions)] if versions else None,
    }


def _recording(directory: Path) -> Recording:
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory")
    recording = read_metadata(directory)
    if recording is None:
        raise ValueError(f"{directory} has no {METADATA}: not a directory of rlgate episode files")
    return recording
