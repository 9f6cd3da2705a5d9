"""An exported policy file acting in onnxruntime, with numpy alone: no torch (`rlgate.OnnxPolicy`).

    policy = OnnxPolicy.load("cartpole.onnx")           # what `rlgate export` wrote
    episode, reward = policy.new_episode(), 0.0
    obs, _ = env.reset(seed=0)
    while True:
        action = policy.compute_action(obs, episode, reward=reward)   # greedy; explore=True samples
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break

What the file carries from step to step (stacked frames, previous actions and rewards, an LSTM's state) lives in
an `OnnxEpisode`, one per env and episode, as `rlgate.Policy`'s episodes hold it. The file's contract (its
inputs, outputs and initial state) is read from its metadata (docs/onnx.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidProtobuf

from rlgate.core import codec
from rlgate.core.errors import UserError
from rlgate.core.spaces import space_struct
from rlgate.core.tree import first_leaf, flatten, map_structure
from rlgate.export import contract
from rlgate.export.contract import TensorSpec


class OnnxEpisode:
    """One env's running episode as an exported policy sees it: the state its file carries between steps."""

    def __init__(self, initial_state: dict[str, np.ndarray]) -> None:
        self.state = {name: value[None] for name, value in initial_state.items()}  # [1, ...] rows
        self.started = False


class OnnxPolicy:
    """An exported policy (`rlgate export`), acting for one observation or a batch of them, like `rlgate.Policy`.

    `explore=True` needs a file exported with --explore: the noise is drawn from numpy's generator (`seed`), or
    passed in. Greedy actions from such a file feed it the noise that gives them.
    """

    def __init__(self, model: bytes | str | Path, *, seed: int | None = None, threads: int = 1) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # small graphs: one thread; more spin and cost more than they give
        options.inter_op_num_threads = 1
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        found = self.session.get_modelmeta().custom_metadata_map.get(contract.CONTRACT_KEY)
        if found is None:
            raise UserError(
                f"{model if isinstance(model, str | Path) else 'the model'} is no rlgate export (no "
                f"{contract.CONTRACT_KEY} metadata)"
            )
        self.contract: dict[str, Any] = json.loads(found)
        self.inputs = [TensorSpec.from_json(spec) for spec in self.contract["inputs"]]
        self.outputs = [TensorSpec.from_json(spec) for spec in self.contract["outputs"]]
        self.observation_space: gym.Space = codec.space_from_json(self.contract["observation_space"])
        self.action_space: gym.Space = codec.space_from_json(self.contract["action_space"])
        dtypes = {spec.name: spec.dtype for spec in self.inputs}
        self.initial_state = {
            name: np.asarray(value, dtypes[contract.STATE_IN + name])
            for name, value in self.contract["initial_state"].items()
        }
        self.obs_leaves = contract.leaf_paths(self.observation_space)
        self.noise = next((spec for spec in self.inputs if spec.name == contract.NOISE), None)
        self.noise_kind, self.greedy_noise = self.contract.get("noise_kind"), self.contract.get("greedy_noise")
        self.version = int(self.contract["model_version"])
        self._names = {spec.name for spec in self.inputs}
        self._rng = np.random.default_rng(seed)

    @classmethod
    def load(cls, path: str | Path, *, seed: int | None = None) -> OnnxPolicy:
        """The policy in an exported file; UserError where there is none."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"no exported policy at {path}: no such file")
        try:
            return cls(path, seed=seed)
        except (Fail, InvalidProtobuf) as exc:  # not ONNX at all
            raise UserError(f"{path} is not an ONNX file onnxruntime can load: {exc}") from None

    def new_episode(self) -> OnnxEpisode:
        """A fresh episode: make one per env, and a new one whenever that env resets."""
        return OnnxEpisode(self.initial_state)

    def compute_action(
        self, observation: Any, episode: OnnxEpisode | None = None, *, reward: float = 0.0, explore: bool = False
    ) -> Any:
        """The action for one observation: see `rlgate.Policy.compute_action`."""
        batch = map_structure(lambda x: np.asarray(x)[None], observation)
        actions = self.compute_actions(batch, None if episode is None else [episode], rewards=[reward], explore=explore)
        return actions[0]

    def compute_actions(
        self,
        observations: Any,
        episodes: Sequence[OnnxEpisode] | None = None,
        *,
        rewards: Sequence[float] | None = None,
        explore: bool = False,
        noise: np.ndarray | None = None,
    ) -> np.ndarray:
        """Actions for a batch of observations ([B, ...], nested for Dict/Tuple spaces), row i for `episodes[i]`
        (default: fresh ones) after `rewards[i]`. `noise`: the draws to sample from (explore), [B, width]."""
        size = len(first_leaf(observations))
        episodes = list(episodes) if episodes is not None else [self.new_episode() for _ in range(size)]
        rewards = list(rewards) if rewards is not None else [0.0] * size
        if not len(episodes) == len(rewards) == size:
            raise ValueError(f"{size} observations need as many episodes and rewards ({len(episodes)}, {len(rewards)})")
        feeds = self.observation_feeds(observations)
        if contract.REWARD in self._names:  # an episode's first reward (at its reset) counts as 0, as in Policy
            paid = [reward if episode.started else 0.0 for episode, reward in zip(episodes, rewards, strict=True)]
            feeds[contract.REWARD] = np.array(paid, np.float32)
        for name in self.initial_state:
            feeds[contract.STATE_IN + name] = np.concatenate([e.state[name] for e in episodes])
        if self.noise is not None:
            feeds[contract.NOISE] = self._noise(size, explore, noise)
        elif explore:
            raise ValueError("this file chooses greedy actions only: export it with --explore to sample")
        outputs = self.run(feeds)
        for i, episode in enumerate(episodes):
            episode.state = {name: outputs[contract.STATE_OUT + name][i : i + 1] for name in self.initial_state}
            episode.started = True
        return outputs[contract.ACTIONS]

    def observation_feeds(self, observations: Any) -> dict[str, np.ndarray]:
        """The observation inputs for a batch of observations (nested as the observation space)."""
        leaves = flatten(map_structure(lambda _, leaf: leaf, space_struct(self.observation_space), observations))
        specs = {spec.name: spec for spec in self.inputs}
        return {
            name: np.ascontiguousarray(leaf, dtype=specs[name].dtype)
            for (name, _), leaf in zip(self.obs_leaves, leaves, strict=True)
        }

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs by name for these inputs by name."""
        return dict(zip([spec.name for spec in self.outputs], self.session.run(None, feeds), strict=True))

    def _noise(self, rows: int, explore: bool, given: np.ndarray | None) -> np.ndarray:
        assert self.noise is not None  # asked only of a graph with a noise input
        shape = (rows, *self.noise.shape[1:])
        if given is not None:
            return np.asarray(given, np.float32).reshape(shape)
        if not explore:
            return np.full(shape, self.greedy_noise, np.float32)
        if self.noise_kind == "exponential":
            return self._rng.standard_exponential(shape, np.float32)
        return self._rng.standard_normal(shape, np.float32)
