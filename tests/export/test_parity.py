"""An exported policy acts as `rlgate.Policy` acts with the same checkpoint, in real onnxruntime: for each family
(Discrete, Box and MultiDiscrete actions, Dict/Tuple observations, SAC's policies, an LSTM with previous actions and
rewards, MeanStdFilter with frame stacking) the same actions on 1,000 observations (exactly for discrete actions, within
1e-5 for continuous ones), and with --explore the same sampled action (and log-probability, and for Box actions the
module's own action that the episode records) for the same noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlgate import Policy
from rlgate.connectors.env_to_module.mean_std_filter import RunningStats
from rlgate.core.columns import Columns
from rlgate.core.tree import map_structure
from rlgate.export.checkpoint import export_checkpoint
from rlgate.export.pieces import NotExportable
from rlgate.export.runtime import OnnxPolicy
from rlgate.models import weights_to_bytes
from rlgate.spec.build import build_policy
from rlgate.spec.imports import ImportPolicy
from rlgate.spec.run import RunSpec
from rlgate.storage import checkpoint

BOX4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ROWS = 1000
DICT_OBS = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        "kind": gym.spaces.Discrete(4),
        "bits": gym.spaces.MultiBinary(2),
        "grid": gym.spaces.Box(0.0, 1.0, (2, 2), np.float64),
        "md": gym.spaces.MultiDiscrete([2, 3]),
        "pair": gym.spaces.Tuple((gym.spaces.Discrete(3, start=1), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))),
    }
)
LSTM = {
    "connectors": {"env_to_module": [{"type": "PrevActionsPrevRewards", "n_prev_actions": 2, "n_prev_rewards": 2}]},
    "model": {"config": {"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8}},
    "sampling": {"episode_lookback_horizon": 2},
}
FILTERED_FRAMES = {
    "connectors": {
        "env_to_module": [
            {"type": "MeanStdFilter", "clip_by_value": 3.0},
            {"type": "FrameStackingEnvToModule", "num_frames": 4},
        ]
    },
    "sampling": {"episode_lookback_horizon": 3},
}
# Stateless families: (observation space, action space, spec).
STATELESS = {
    "discrete": (BOX4, gym.spaces.Discrete(3), {}),
    "box": (BOX4, gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32)), {}),
    "multi-discrete": (BOX4, gym.spaces.MultiDiscrete([3, 4]), {}),
    "dict-observations": (DICT_OBS, gym.spaces.Discrete(3), {}),
    # SAC's policy: a tanh-squashed Gaussian (unsquashed to the bounds after) or a Categorical.
    "sac-box": (BOX4, gym.spaces.Box(-2.0, 2.0, (2,), np.float32), {"algorithm": {"name": "SAC"}}),
    "sac-discrete": (BOX4, gym.spaces.Discrete(3), {"algorithm": {"name": "SAC"}}),
}


def save_checkpoint(
    directory: Path,
    spec: dict[str, Any],
    observation_space: gym.Space,
    action_space: gym.Space,
    connector_state: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint of `spec` (seed 3) with `wide_weights`, version 7."""
    run = RunSpec.model_validate({**spec, "seed": 3})
    return checkpoint.save(
        directory,
        version=7,
        spec=run,
        observation_space=observation_space,
        action_space=action_space,
        weights=wide_weights(run, observation_space, action_space, seed=5),
        connector_state=connector_state,
    )


def wide_weights(run: RunSpec, observation_space: gym.Space, action_space: gym.Space, seed: int) -> bytes:
    """The spec's module with its weights spread wide (N(0, 0.5)): logits far apart and Box means past the bounds,
    so the actions cover every class and the clipping, and near-ties (where rounding could pick either) are rare."""
    built = build_policy(run, observation_space, action_space, ImportPolicy(run.modules()))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in built.module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return weights_to_bytes(built.module)


def exported(path: Path, tmp_path: Path, explore: bool = False) -> OnnxPolicy:
    file = tmp_path / f"policy-{explore}.onnx"
    file.write_bytes(export_checkpoint(path, explore=explore))
    return OnnxPolicy.load(file)


def observations(space: gym.Space, rows: int, seed: int) -> Any:
    space.seed(seed)
    samples = [space.sample() for _ in range(rows)]
    return map_structure(lambda *leaves: np.stack(leaves), *samples)


def same_actions(torch_actions: np.ndarray, onnx_actions: np.ndarray, action_space: gym.Space) -> None:
    if isinstance(action_space, gym.spaces.Box):
        assert onnx_actions.dtype == action_space.dtype
        np.testing.assert_allclose(onnx_actions, torch_actions, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(onnx_actions, torch_actions)


def draw_noise(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The noise the torch path draws after torch.manual_seed(seed), as GetActions' distribution draws it."""
    torch.manual_seed(seed)
    return (torch.empty(shape).exponential_() if kind == "exponential" else torch.randn(shape)).numpy()


@pytest.mark.parametrize("family", list(STATELESS))
def test_greedy_actions_equal_the_policy_on_1000_observations(tmp_path, family):
    observation_space, action_space, spec = STATELESS[family]
    path = save_checkpoint(tmp_path, spec, observation_space, action_space)
    batch = observations(observation_space, ROWS, seed=1)

    expected = Policy.load(path).compute_actions(batch)
    actions = exported(path, tmp_path).compute_actions(batch)

    same_actions(expected, actions, action_space)
    if isinstance(action_space, gym.spaces.Box):  # unsquashed past the bounds and clipped, as the server does
        assert (actions == action_space.low).any() and (actions == action_space.high).any()
    else:
        assert len(np.unique(actions, axis=0)) > 1


@pytest.mark.parametrize("family", list(STATELESS))
def test_explore_samples_the_policys_action_for_the_same_noise(tmp_path, family):
    observation_space, action_space, spec = STATELESS[family]
    path = save_checkpoint(tmp_path, spec, observation_space, action_space)
    batch = observations(observation_space, ROWS, seed=2)
    policy, onnx_policy = Policy.load(path), exported(path, tmp_path, explore=True)
    noise = draw_noise(onnx_policy.noise_kind, (ROWS, *onnx_policy.noise.shape[1:]), seed=11)

    episodes = [policy.new_episode() for _ in range(ROWS)]
    torch.manual_seed(11)  # the torch path draws `noise` again
    expected = policy.compute_actions(batch, episodes, explore=True)
    onnx_episodes = [onnx_policy.new_episode() for _ in range(ROWS)]
    outputs = onnx_policy.run({**onnx_policy.observation_feeds(batch), "noise": noise})

    same_actions(expected, outputs["actions"], action_space)
    logp = np.array([episode.last_outputs[Columns.ACTION_LOGP] for episode in episodes])
    np.testing.assert_allclose(outputs["action_logp"], logp, rtol=1e-5, atol=1e-5)
    # What an episode records: a Box's actions as the module sampled them (past the bounds too), not the env's.
    if isinstance(action_space, gym.spaces.Box):
        recorded = np.stack([episode.last_outputs[Columns.ACTIONS] for episode in episodes])
        assert outputs["module_actions"].dtype == recorded.dtype
        np.testing.assert_allclose(outputs["module_actions"], recorded, rtol=1e-5, atol=1e-5)  # (means of 100s)
        assert not np.array_equal(outputs["module_actions"], outputs["actions"])
    else:
        assert "module_actions" not in outputs  # the actions are the module's own
    # Sampling: other noise, other actions; the greedy noise, the greedy actions.
    assert not np.array_equal(onnx_policy.compute_actions(batch, onnx_episodes, explore=True), outputs["actions"])
    same_actions(policy.compute_actions(batch), onnx_policy.compute_actions(batch), action_space)


def test_a_dqn_module_exports_its_greedy_actions_and_refuses_to_explore(tmp_path):
    """DQN's module returns its actions (the argmax of Q; epsilon-greedy when exploring), no distribution inputs:
    the file gives the greedy ones; its exploration draws from torch's generator, which no input stands for."""
    action_space = gym.spaces.Discrete(3)
    path = save_checkpoint(tmp_path, {"algorithm": {"name": "DQN"}}, BOX4, action_space)
    batch = observations(BOX4, ROWS, seed=1)
    onnx_policy = exported(path, tmp_path)
    assert [spec.name for spec in onnx_policy.outputs] == ["actions"]
    actions = onnx_policy.compute_actions(batch)
    same_actions(Policy.load(path).compute_actions(batch), actions, action_space)
    assert len(np.unique(actions)) == 3
    with pytest.raises(NotExportable, match=r"DQN's epsilon-greedy .*: export it without --explore"):
        exported(path, tmp_path, explore=True)


@pytest.mark.parametrize("explore", [False, True], ids=["greedy", "explore"])
@pytest.mark.parametrize("family", ["lstm", "mean-std-filter-frame-stacking"])
def test_stateful_families_carry_their_state_as_the_policy_does(tmp_path, family, explore):
    """8 envs, 125 steps each (1,000 observations), episodes of 20 to 60 steps: the file's state (previous actions
    and rewards, the LSTM's h and c; frames normalised with the checkpoint's statistics) carried by OnnxPolicy
    gives the Policy's actions at every step, across resets."""
    if family == "lstm":
        spec, state = LSTM, None
    else:
        spec = FILTERED_FRAMES
        samples = np.random.default_rng(0).normal(0.3, 2.0, (500, 4))
        stats = {"global": [RunningStats.of(samples).to_state()], "delta": [RunningStats.zeros((4,)).to_state()]}
        state = {"MeanStdFilter": stats}
    action_space = gym.spaces.Discrete(3)
    path = save_checkpoint(tmp_path, spec, BOX4, action_space, connector_state=state)
    policy, onnx_policy = Policy.load(path), exported(path, tmp_path, explore=explore)
    rng = np.random.default_rng(3)
    envs = 8
    episodes = [policy.new_episode() for _ in range(envs)]
    onnx_episodes = [onnx_policy.new_episode() for _ in range(envs)]
    ends = rng.integers(20, 60, envs)
    steps = np.zeros(envs, int)
    rewards = [0.0] * envs
    seen = set()
    for t in range(ROWS // envs):
        batch = rng.normal(0.0, 2.0, (envs, 4)).astype(np.float32)
        if explore:
            noise = draw_noise(onnx_policy.noise_kind, (envs, 3), seed=t)
            torch.manual_seed(t)
        expected = policy.compute_actions(batch, episodes, rewards=rewards, explore=explore)
        actions = onnx_policy.compute_actions(
            batch, onnx_episodes, rewards=rewards, explore=explore, noise=noise if explore else None
        )
        np.testing.assert_array_equal(actions, expected, err_msg=f"step {t}")
        seen.update(actions.tolist())
        rewards = rng.normal(size=envs).tolist()
        steps += 1
        for i in np.flatnonzero(steps == ends):  # this env resets: both start a new episode
            episodes[i], onnx_episodes[i], steps[i] = policy.new_episode(), onnx_policy.new_episode(), 0
    assert seen == {0, 1, 2}
