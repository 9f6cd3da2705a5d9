"""Episode files (`rlgate serve --episode-dir`): spaces and run spec beside them, read back as episodes."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from support.servers import BOX4, DISCRETE2, shipped, target

from rlgate import read_episodes
from rlgate.cli.main import main
from rlgate.client.env_client import EnvClient
from rlgate.core import codec
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.spec.run import RunSpec
from rlgate.storage.episode_files import Recording, read_metadata, summarize, write_metadata

ENV = "CartPole-v1"


async def record(server_factory, tmp_path, spec: dict, steps: int = 400) -> tuple[EnvClient, object]:
    """A fresh-model server for CartPole recording into tmp_path/episodes, fed by one client of 2 envs."""
    server = await server_factory(spec=RunSpec.model_validate({"env": {"id": ENV}, "seed": 0, **spec}))
    client = EnvClient(gym.vector.SyncVectorEnv([lambda: gym.make(ENV)] * 2), target(server), seed=0)
    await client.run(max_steps=steps)
    await server.stop()  # writes what is queued
    return client, server


@pytest.mark.slow
async def test_recorded_episodes_read_back_with_their_spaces_and_spec(server_factory, tmp_path):
    client, _ = await record(server_factory, tmp_path, {})
    directory = tmp_path / "episodes"
    metadata = json.loads((directory / "metadata.json").read_text())
    assert metadata["env_id"] == ENV and metadata["spec"]["env"]["id"] == ENV and metadata["spec"]["seed"] == 0
    env = gym.make(ENV)
    assert codec.space_from_json(metadata["observation_space"]) == env.observation_space
    assert codec.space_from_json(metadata["action_space"]) == env.action_space

    episodes = list(read_episodes(directory))
    messages = shipped(directory)
    assert len(episodes) == len(messages) > 0
    assert all(isinstance(e, SingleAgentEpisode) and e.observation_space == env.observation_space for e in episodes)
    assert {(e.id_, e.chunk_index) for e in episodes} == {(m.id, m.chunk_index) for m in messages}
    for episode in episodes:
        assert all(env.observation_space.contains(o) for o in episode.get_observations())
        assert Columns.ACTION_LOGP in episode.extra_model_outputs  # what offline RL needs of the behaviour policy
    order = [(e.id_, e.chunk_index) for e in episodes]
    assert order == sorted(order)  # chunks of one episode one after another

    summary = summarize(directory)
    returns: dict[str, float] = {}
    for episode in episodes:
        returns[episode.id_] = returns.get(episode.id_, 0.0) + episode.get_return()
    ended = {e.id_: e.is_terminated for e in episodes if e.is_done and not e.session_closed}
    cut_off = [e for e in episodes if e.session_closed]
    # Every episode the client ended was recorded to its end, and the two it left running cut off as truncated:
    # not finished episodes.
    assert len(cut_off) == 2 and all(e.is_truncated and not e.is_terminated for e in cut_off)
    assert summary["terminated_episodes"] == sum(ended.values()) == client.stats.episodes
    assert summary["finished_episodes"] == len(ended) == client.stats.episodes
    assert sorted(returns[key] for key, terminated in ended.items() if terminated) == sorted(client.stats.returns)
    finished = [returns[key] for key in ended]
    assert (summary["return_min"], summary["return_max"]) == (min(finished), max(finished))
    assert summary["return_mean"] == pytest.approx(np.mean(finished))
    assert summary["env_steps"] == sum(len(e) for e in episodes) == client.stats.env_steps
    assert summary["model_versions"] == [0, 0]

    ran = subprocess.run(
        [sys.executable, "-m", "rlgate", "episodes", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.splitlines()[0] == f"{directory}: {ENV}"
    assert f"{summary['chunks']} chunks of {summary['episodes']} episodes" in ran.stdout


async def test_observations_are_stored_as_the_pipeline_left_them(server_factory, tmp_path):
    await record(server_factory, tmp_path, {"connectors": {"env_to_module": ["MeanStdFilter"]}}, steps=100)
    recording = read_metadata(tmp_path / "episodes")
    assert recording.observation_space == gym.spaces.Box(-10.0, 10.0, (4,), np.float32)  # MeanStdFilter's output
    assert recording.env_observation_space == gym.make(ENV).observation_space
    episodes = list(read_episodes(tmp_path / "episodes"))
    assert episodes and all(e.observation_space == recording.observation_space for e in episodes)


async def test_a_directory_of_other_spaces_is_left_alone(server_factory, tmp_path):
    directory = tmp_path / "episodes"
    directory.mkdir()
    write_metadata(directory, Recording(BOX4, gym.spaces.Discrete(3)))
    before = (directory / "metadata.json").read_text()
    await record(server_factory, tmp_path, {}, steps=100)
    assert (directory / "metadata.json").read_text() == before and not list(directory.glob("*.pb"))
    (other,) = directory.glob("run-*")
    assert read_metadata(other).action_space == DISCRETE2 and list(read_episodes(other))


def test_a_directory_without_metadata_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"has no metadata\.json"):
        list(read_episodes(tmp_path))
    assert main(["episodes", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"rlgate: {tmp_path} has no metadata.json: not a directory of rlgate episode files"
    ]


def test_a_file_that_is_not_an_episode_is_a_one_line_error_naming_it(tmp_path, capsys):
    write_metadata(tmp_path, Recording(BOX4, DISCRETE2))
    junk = tmp_path / "zzzz-1-0.pb"
    junk.write_bytes(b"\xff junk")
    assert main(["episodes", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rlgate: {junk}: Error parsing message"), line
