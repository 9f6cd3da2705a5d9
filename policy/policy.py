"""`Policy`: a trained policy in plain Python, from a checkpoint or a running learner.

The counterpart of SB3's `PPO.load(path).predict(obs)` and RLlib's `RLModule.from_checkpoint` plus its
connectors. A `Policy` computes actions with the checkpoint's own pipelines: its env-to-module pieces
(MeanStdFilter with the saved statistics, frame stacking, the user's pieces), its module and its
module-to-env pieces, exactly as a server does. What a piece needs from earlier steps (stacked frames, an
LSTM's state, the previous reward) lives in a `PolicyEpisode`, one per env and episode::

    policy = Policy.load("runs/CartPole-v1-20250101-120000/checkpoints")
    obs, _ = env.reset(seed=0)
    episode, reward, done = policy.new_episode(), 0.0, False
    while not done:
        action = policy.compute_action(obs, episode, reward=reward)   # greedy; explore=True samples
        obs, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated

Without an episode each call is a fresh episode's first step (enough for a plain MLP policy). `Policy.load` of a
file `rlgate export` wrote (.onnx) gives an `OnnxPolicy`, which acts the same with onnxruntime alone.
MeanStdFilter statistics stay as loaded: evaluating does not change the normalisation.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.core.columns import Columns
from rlgate.core.tree import first_leaf, map_structure
from rlgate.episodes import SingleAgentEpisode
from rlgate.policy.acting import ActingCore
from rlgate.policy.trained import TrainedPolicy
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import RunSpec

if TYPE_CHECKING:
    from rlgate.export.runtime import OnnxPolicy

# An episode keeps at most this many steps (plus the spec's lookback) in memory; older ones are cut off.
KEEP_STEPS = 1000
# The model outputs an episode keeps besides the actions: a recurrent module's state, for its next step.
RECORDED = (Columns.STATE_OUT,)


class PolicyEpisode:
    """One env's running episode as the policy sees it: past observations, actions, rewards and model
    outputs (recurrent state), for the connector pieces and module that read them. Start a new one when
    the env resets."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, lookback: int) -> None:
        self.episode = SingleAgentEpisode(
            f"policy-{uuid.uuid4().hex}", observation_space=observation_space, action_space=action_space
        )
        self.last_outputs: dict[str, Any] = {}  # the latest step's actions, action_dist_inputs, state_out, ...
        self._lookback = lookback

    def observe(self, observation: Any, reward: float) -> None:
        """The env's new observation, and the reward for the previous action (ignored on the first step)."""
        episode = self.episode
        if not episode.is_reset:
            episode.add_env_reset(observation)
            return
        extra = {key: value for key, value in self.last_outputs.items() if key in RECORDED}
        action = self.last_outputs[Columns.ACTIONS]
        episode.add_env_step(observation, action, float(reward), extra_model_outputs=extra)
        if len(episode) >= KEEP_STEPS:
            self.episode = episode.cut(len_lookback_buffer=self._lookback)


class Policy(TrainedPolicy):
    """A policy's pipelines and module, acting for one observation or a batch (see the module docstring)."""

    def __init__(
        self,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        weights: bytes | None = None,
        connector_state: dict[str, Any] | None = None,
        version: int = 0,
        imports: ImportPolicy | None = None,
        device: str = "cpu",
        seed: int | None = None,
    ) -> None:
        """The spec's policy for these env spaces (with `weights` and `connector_state`, else fresh).
        `imports`: where code the spec names may come from (default: rlgate's own only); `seed` seeds
        torch's generator, which samples the actions of explore=True (as a server's --seed does)."""
        if spec.multi_agent is not None:
            raise SpecError(
                "a multi-agent run ([multi_agent]): Policy acts in single-agent runs; use rlgate.MultiAgentPolicy"
            )
        self._act_with(
            ActingCore.build(
                spec,
                observation_space,
                action_space,
                imports,
                weights=weights,
                connector_state=connector_state,
                version=version,
                device=device,
                seed=seed,
            )
        )
        self.observation_space = observation_space
        self.action_space = action_space

    @classmethod
    def load(  # type: ignore[override]  # by design: an exported .onnx file loads as an OnnxPolicy (same calls)
        cls, path: str | Path, *, allow_import: Iterable[str] = (), device: str = "cpu", seed: int | None = None
    ) -> Policy | OnnxPolicy:
        """The policy in a checkpoint directory (see TrainedPolicy.load), or in a file `rlgate export` wrote
        (.onnx): an OnnxPolicy then, with the same calls, acting in onnxruntime (no torch; `seed` seeds its
        noise)."""
        if Path(path).suffix == ".onnx":
            from rlgate.export.runtime import OnnxPolicy  # onnxruntime loads only for such a file

            return OnnxPolicy.load(path, seed=seed)
        return super().load(path, allow_import=allow_import, device=device, seed=seed)

    @classmethod
    def from_parts(
        cls,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        weights: bytes | dict[str, bytes],
        **kwargs: Any,
    ) -> Policy:
        """`Policy(...)` from what a checkpoint or a learner holds (see `TrainedPolicy`)."""
        if isinstance(weights, dict):
            raise SpecError("a multi-agent run's weights (one set per module): use rlgate.MultiAgentPolicy")
        return cls(spec, observation_space, action_space, weights=weights, **kwargs)

    def new_episode(self) -> PolicyEpisode:
        """A fresh episode: make one per env, and a new one whenever that env resets."""
        return PolicyEpisode(self.observation_space, self.action_space, self._lookback)

    def compute_action(
        self, observation: Any, episode: PolicyEpisode | None = None, *, reward: float = 0.0, explore: bool = False
    ) -> Any:
        """The action for one observation (as the env's action space holds it). `episode`: the env's
        running episode (None: a fresh one); `reward`: what the env paid for the previous action;
        `explore`: sample from the action distribution instead of taking its most likely action."""
        batch = map_structure(lambda x: np.asarray(x)[None], observation)
        actions = self.compute_actions(batch, None if episode is None else [episode], rewards=[reward], explore=explore)
        return map_structure(lambda x: x[0], actions)

    def compute_actions(
        self,
        observations: Any,
        episodes: Sequence[PolicyEpisode] | None = None,
        *,
        rewards: Sequence[float] | None = None,
        explore: bool = False,
    ) -> Any:
        """Actions for a batch of observations ([B, ...], nested for Dict/Tuple spaces, as a vector env
        returns them), one row per env: `episodes[i]` and `rewards[i]` are row i's (see compute_action)."""
        size = len(first_leaf(observations))
        episodes = list(episodes) if episodes is not None else [self.new_episode() for _ in range(size)]
        rewards = list(rewards) if rewards is not None else [0.0] * size
        if not len(episodes) == len(rewards) == size:
            raise ValueError(f"{size} observations need as many episodes and rewards ({len(episodes)}, {len(rewards)})")
        for i, episode in enumerate(episodes):
            episode.observe(map_structure(lambda x, i=i: x[i], observations), rewards[i])
        outputs = self.core.act([e.episode for e in episodes], explore, map_structure(np.asarray, observations))
        for i, episode in enumerate(episodes):
            episode.last_outputs = map_structure(lambda x, i=i: x[i], outputs)
        return outputs[Columns.ACTIONS_FOR_ENV]
