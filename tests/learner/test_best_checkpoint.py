"""The learner keeps its best checkpoint by mean return (`<checkpoint dir>/best`) and says so in /status, so a
long-running learner whose newest versions got worse still has its good policy, loadable as any checkpoint."""

from __future__ import annotations

import json

import gymnasium as gym
import torch

from rlgate.learner.best_checkpoint import BestCheckpoint
from rlgate.learner.main import LearnerServer
from rlgate.models import weights_to_bytes
from rlgate.spec.build import build_rl_module
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint

SPEC = RunSpec.model_validate({"env": {"id": "CartPole-v1"}, "seed": 0})
SPACES = (gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2))


def write(directory, version: int, mean_return: float | None):
    """A real checkpoint of a fresh CartPole module, its weights marked by `version`."""
    module = build_rl_module(SPEC, *SPACES, ImportPolicy())
    with torch.no_grad():
        next(module.parameters()).fill_(version)
    return checkpoint.save(
        directory,
        version=version,
        spec=SPEC,
        observation_space=SPACES[0],
        action_space=SPACES[1],
        weights=weights_to_bytes(module),
        mean_return=mean_return,
    )


def test_best_links_the_first_checkpoint_of_the_highest_mean_return_and_survives_a_restart(tmp_path):
    best = BestCheckpoint(tmp_path)
    offers = [(1, None), (2, 20.0), (3, 35.0), (4, 35.0), (5, 10.0)]  # None: fewer episodes than a full window
    taken = [best.offer(write(tmp_path, v, mean), v, mean) for v, mean in offers]
    assert taken == [False, True, True, False, False]
    assert best.status() == {"path": str(tmp_path / "best"), "version": 3, "mean_return": 35.0}
    loaded = checkpoint.load(tmp_path / "best")  # what serve --checkpoint, eval and Policy.load read
    assert loaded.version == 3 and loaded.weights == (tmp_path / "v000003" / "weights.safetensors").read_bytes()
    assert checkpoint.load(tmp_path).version == 5  # `latest` is still the newest
    again = BestCheckpoint(tmp_path)  # a restarted learner
    assert again.status() == best.status()
    assert not again.offer(write(tmp_path, 6, 30.0), 6, 30.0) and again.offer(write(tmp_path, 7, 40.0), 7, 40.0)
    fresh = BestCheckpoint(tmp_path, resume=False)  # a fresh model: an earlier run's best is not its own
    assert fresh.status() is None and not (tmp_path / "best").exists() and (tmp_path / "v000007").is_dir()


async def test_a_learner_keeps_its_best_checkpoint_and_says_so_in_its_status(
    learner_settings, train_updates, http_get
) -> None:
    server = LearnerServer(learner_settings(checkpoint_every=1))
    await server.start()
    try:
        await train_updates(server, 5)  # random CartPole play: 20 episodes end within the first few updates
        code, body = await http_get(server.http_port, "/status")
    finally:
        await server.stop()
    assert code == 200
    best = json.loads(body)["best_checkpoint"]
    assert best is not None and best["path"] == str(server.settings.checkpoint_dir / "best")
    means = {
        int(m["version"]): m["mean_return"]
        for m in (json.loads(p.read_text()) for p in server.settings.checkpoint_dir.glob("v*/metadata.json"))
    }
    assert means[best["version"]] == best["mean_return"]
    # Every later checkpoint (its window as full) has a mean no higher: none would have replaced it.
    assert all(mean <= best["mean_return"] for version, mean in means.items() if version > best["version"])
    assert checkpoint.load(server.settings.checkpoint_dir / "best").version == best["version"]
