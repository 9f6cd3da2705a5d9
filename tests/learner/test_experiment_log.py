"""The experiment log: TensorBoard event files and progress.csv, one record per update, against env steps;
and PPO's diagnostics (clip fraction, explained variance) in them."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

from rlgate.learner.experiment_log import ALGORITHM_COLUMNS, COLUMNS, DATA_PARALLEL_COLUMNS, PROGRESS, ExperimentLog
from rlgate.learner.main import LearnerServer
from rlgate.learner.ppo import explained_variance
from rlgate.spec.algorithm import scheduled


def scalars(directory: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every scalar in the event files under `directory`, read as TensorBoard does."""
    found: dict[str, dict[int, float]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = float(tensor_util.make_ndarray(value.tensor))
    return found


async def test_every_update_goes_to_tensorboard_and_progress_csv_against_env_steps(learner_settings, train_updates):
    server = LearnerServer(learner_settings())
    await server.start()
    try:
        await train_updates(server, 3)
        learner = server.learner
        rows = learner.progress.updates.page(0)["rows"]
        status = learner.status()
    finally:
        await server.stop()  # closes the log
    log_dir = learner.settings.checkpoint_dir / "logs"  # the default: beside the checkpoints
    steps = [row["env_steps"] for row in rows]
    assert len(steps) == 3 and steps[-1] == status["env_steps_trained"] and steps == sorted(steps)

    written = scalars(log_dir)
    others = {name for algorithm, names in ALGORITHM_COLUMNS.items() for name in names} - set(ALGORITHM_COLUMNS["PPO"])
    others |= set(DATA_PARALLEL_COLUMNS)  # one learner: no group
    expected = {tag for name, tag in COLUMNS.items() if tag is not None and name not in others}
    assert expected <= set(written), expected - set(written)
    for key, tag in COLUMNS.items():
        if tag is not None and key not in others:
            assert sorted(written[tag]) == steps, tag  # x axis: env steps, one point per update
            assert np.allclose([written[tag][s] for s in steps], [row[key] for row in rows], rtol=1e-6), tag
    assert written["train/version"] == {s: v for s, v in zip(steps, (1, 2, 3), strict=True)}
    assert all(0 <= v <= 1 for v in written["train/clip_fraction"].values())
    assert all(-1 <= v <= 1 for v in written["train/explained_variance"].values())
    assert written["episodes/return_min"][steps[-1]] <= written["episodes/return_mean"][steps[-1]]
    assert np.isclose(written["episodes/return_mean"][steps[-1]], status["mean_return"], rtol=1e-6)

    with open(log_dir / PROGRESS, newline="") as file:
        table = list(csv.DictReader(file))
    assert list(table[0]) == list(COLUMNS) and [int(r["env_steps"]) for r in table] == steps
    schedule = learner.spec.algorithm.lr  # CartPole's preset: linear from 1e-3 over the env steps trained
    before = [0, *steps[:-1]]  # each update's lr is the schedule's at the steps trained before it
    assert [float(r["lr"]) for r in table] == pytest.approx([scheduled(schedule, s) for s in before])


async def test_a_resumed_learner_appends_to_its_log(learner_settings, train_updates, tmp_path):
    settings = learner_settings(log_dir=tmp_path / "run")
    for _ in range(2):  # the second learner resumes from the first's final checkpoint
        server = LearnerServer(settings)
        await server.start()
        try:
            await train_updates(server, 1)
        finally:
            await server.stop()
    with open(tmp_path / "run" / PROGRESS, newline="") as file:
        table = list(csv.DictReader(file))
    assert [int(r["version"]) for r in table] == [1, 2]
    assert int(table[1]["env_steps"]) > int(table[0]["env_steps"])  # env steps go on from the checkpoint
    assert sorted(scalars(tmp_path / "run")["train/version"].values()) == [1, 2]


def test_a_progress_file_with_other_columns_is_set_aside(tmp_path):
    (tmp_path / PROGRESS).write_text("step,reward\n1,2\n")
    log = ExperimentLog(tmp_path)
    log.write({"env_steps": 10, "version": 1, "policy_loss": 0.5, "episode_return_mean": None})
    log.close()
    (aside,) = tmp_path.glob("progress-*.csv")
    assert aside.read_text() == "step,reward\n1,2\n"
    with open(tmp_path / PROGRESS, newline="") as file:
        (row,) = list(csv.DictReader(file))
    assert (row["env_steps"], row["policy_loss"], row["episode_return_mean"]) == ("10", "0.5", "")


def test_explained_variance_counts_only_masked_rows():
    targets = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    mask = torch.tensor([True, True, True, True, False])
    assert explained_variance(targets, targets.clone(), mask).item() == 1.0
    mean_only = torch.full_like(targets, 2.5)  # predicts the mean of the masked rows: explains nothing
    assert abs(explained_variance(targets, mean_only, mask).item()) < 1e-6
    assert explained_variance(targets, -10 * targets, mask).item() == -1.0  # clamped, as RLlib does
