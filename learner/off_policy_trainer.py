"""The off-policy training step (DQN, SAC): chunks into the replay buffer, updates at the replay ratio, version + 1.

Each call of `update(chunks)` adds the chunks to the replay buffer (their env steps are then sampled) and runs the
updates they earned: once `num_steps_sampled_before_learning_starts` env steps are in, every
`train_batch_size / training_intensity` env steps earn one update of `train_batch_size` replayed transitions, at
most `broadcast_interval` per call. A call that updated publishes one new version (servers act with it), whose
stats are the mean over its updates. Targets move after an update once `target_network_update_freq` env steps
were sampled since they last did (every update for 0), as RLlib's DQNLearner counts. A call whose updates leave
a non-finite value anywhere is undone (module, target networks, temperature and optimizers) and skipped, as PPO's.

The replay buffer keeps what the losses read (observations, actions, rewards, done flags) and the model version
that chose each action, for the `staleness` diagnostic: servers may act with older weights, which off-policy
learning takes as it is. When the learner pipeline holds only its default pieces, batches come from the buffer's
columns at once (`sample_transitions`); with a piece of the user's, the sampled one-step episodes go through the
pipeline, as RLlib's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from rlgate.connectors import ConnectorPipelineV2
from rlgate.connectors.builders import build_learner_pipeline
from rlgate.core.columns import Columns
from rlgate.episodes import SingleAgentEpisode
from rlgate.learner.dqn import DQNLearner
from rlgate.learner.episode_replay_buffer import EpisodeReplayBuffer
from rlgate.learner.prioritized_episode_replay_buffer import PrioritizedEpisodeReplayBuffer
from rlgate.learner.sac import SACLearner
from rlgate.learner.trainer import Snapshot, scheduled_values, skipped_reason
from rlgate.models import RLModule
from rlgate.spec.algorithm import DQNConfig, ReplayBufferConfig, SACConfig
from rlgate.spec.checkpoint import State, optimizer_from_tensors, optimizer_to_tensors

#: The default learner pieces of DQN's and SAC's pipeline, in order: with these alone, the fast path applies.
DEFAULT_PIECES = tuple(type(piece) for piece in build_learner_pipeline(None, None, next_observations=True).connectors)

OffPolicyConfig = DQNConfig | SACConfig


def make_buffer(config: ReplayBufferConfig, seed: int | None) -> EpisodeReplayBuffer:
    """The replay buffer a spec's `replay_buffer_config` names."""
    if config.type == "PrioritizedEpisodeReplayBuffer":
        return PrioritizedEpisodeReplayBuffer(config.capacity, alpha=config.alpha, seed=seed)
    return EpisodeReplayBuffer(config.capacity, seed=seed)


def make_learner(module: RLModule, config: OffPolicyConfig) -> DQNLearner | SACLearner:
    return DQNLearner(module, config) if isinstance(config, DQNConfig) else SACLearner(module, config)


class OffPolicyTrainer:
    """Owns the module being trained, its learner-side networks and optimizers, the replay buffer and the counts."""

    def __init__(
        self,
        module: RLModule,
        pipeline: ConnectorPipelineV2,
        config: OffPolicyConfig,
        *,
        seed: int | None = None,
        version: int = 0,
        env_steps: int = 0,
        state: State | None = None,
        buffer_state: State | None = None,
    ) -> None:
        """`state`: a checkpoint's `learner_state` (optimizers, target networks, alpha, counters) to go on from;
        `buffer_state`: its replay buffer's, if it kept one."""
        self.module = module
        self.pipeline = pipeline
        self.config = config
        self.version = version
        self.env_steps = env_steps  # sampled into the replay buffer since version 0 (kept in checkpoints)
        self.updates = 0  # gradient updates since version 0 (kept in checkpoints)
        self.replayed = 0  # transitions replayed since version 0 (kept in checkpoints)
        self.last_target_update = 0  # env_steps when the targets last moved
        self.learner = make_learner(module, config)
        self.buffer = make_buffer(config.replay_buffer_config, seed)
        self._fast = tuple(type(piece) for piece in pipeline.connectors) == DEFAULT_PIECES
        if state is not None:
            self.load_state(state)
        if buffer_state is not None:
            self.buffer.set_state(*buffer_state)
        self.learner.explore(config.at(env_steps))

    @property
    def spaces(self) -> tuple[Any, Any]:
        return self.module.observation_space, self.module.action_space

    @property
    def optimizer(self) -> None:
        """Off-policy optimizers are in `state()`: there is no single one."""
        return None

    def oldest_version(self) -> int:
        """No steps are too old to replay."""
        return -(2**62)

    def owed_updates(self) -> int:
        """Updates the env steps sampled so far have earned and not had."""
        config = self.config
        start = config.num_steps_sampled_before_learning_starts
        if self.env_steps < start or not len(self.buffer):
            return 0
        return max(0, int((self.env_steps - start) / config.steps_per_update()) - self.updates)

    def steps_trained_for(self) -> float:
        """The env steps whose updates are done: where the next update's steps begin."""
        return self.config.num_steps_sampled_before_learning_starts + self.updates * self.config.steps_per_update()

    def update(self, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
        """Add these chunks to the replay buffer, then run the updates owed (at most `broadcast_interval`).

        The stats have "updates" (0: no new version) and, when the updates were undone for non-finite results,
        "skipped" (why)."""
        added = self.add(episodes)
        count = min(self.owed_updates(), self.config.broadcast_interval)
        counts = {"env_steps": added, "stale_steps": 0, "updates": count}
        if not count:
            return counts
        before = Snapshot(self._everything(), *self.learner.optimizers.values())
        parts: dict[str, list[float]] = {}
        staleness = []
        for _ in range(count):
            config = self.config.at(self.env_steps)
            batch, versions = self._batch()
            stats, td_error = self.learner.update(batch, config)
            if isinstance(self.buffer, PrioritizedEpisodeReplayBuffer):
                self.buffer.update_priorities(td_error.cpu().numpy())
            self.updates += 1
            self.replayed += self.config.train_batch_size
            if self.env_steps - self.last_target_update >= self.config.target_network_update_freq:
                self.learner.update_target(self.config.tau)
                self.last_target_update = self.env_steps
            if versions is not None:
                staleness.append(float(self.version - versions.mean()))
            for key, value in stats.items():
                parts.setdefault(key, []).append(value)
        bad = before.nonfinite_now()
        if bad:
            before.restore()
            self.updates -= count
            self.replayed -= count * self.config.train_batch_size
            return {**counts, "skipped": skipped_reason(bad)}
        self.version += 1
        config = self.config.at(self.env_steps)
        return {
            **{key: float(np.mean(values)) for key, values in parts.items()},
            **scheduled_values(config),
            **self.learner.explore(config),
            **counts,
            "staleness": float(np.mean(staleness)) if staleness else 0.0,
            "buffer_size": len(self.buffer),
            "replay_ratio": self.replayed / max(self.env_steps, 1),
            "updates_total": self.updates,
        }

    def add(self, episodes: list[SingleAgentEpisode]) -> int:
        """Put chunks into the replay buffer, keeping of their model outputs only the versions; their env steps."""
        for episode in episodes:
            for key in list(episode.extra_model_outputs):
                if key != Columns.MODEL_VERSION:
                    del episode.extra_model_outputs[key]
        self.buffer.add(episodes)
        steps = sum(len(episode) for episode in episodes)
        self.env_steps += steps
        return steps

    def _batch(self) -> tuple[dict[str, Any], np.ndarray | None]:
        """A train batch from the replay buffer (tensors), and the model versions of its transitions if known."""
        config = self.config
        sampling = {"n_step": config.n_step, "gamma": config.gamma, "include_extra_model_outputs": True}
        if config.replay_buffer_config.type == "PrioritizedEpisodeReplayBuffer":
            sampling["beta"] = config.replay_buffer_config.beta
        if self._fast:
            columns = self.buffer.sample_transitions(config.train_batch_size, **sampling)
            versions = columns.pop(Columns.MODEL_VERSION, None)
            batch = self.pipeline(rl_module=self.module, batch=columns, episodes=[], explore=False, shared_data={})
            return batch, versions
        episodes = self.buffer.sample(config.train_batch_size, **sampling)
        batch = self.pipeline(rl_module=self.module, batch={}, episodes=episodes, explore=False, shared_data={})
        versions = batch.pop(Columns.MODEL_VERSION, None)
        return batch, None if versions is None else versions.cpu().numpy()

    def state(self) -> State:
        """What a checkpoint keeps of the training beyond the module's weights: every optimizer's state, the learner's
        own networks (targets, SAC's temperature) and the counters."""
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {
            "updates": self.updates,
            "replayed": self.replayed,
            "last_target_update": self.last_target_update,
            "optimizers": {},
        }
        for name, optimizer in self.learner.optimizers.items():
            saved, meta["optimizers"][name] = optimizer_to_tensors(optimizer)
            tensors |= {f"optimizer.{name}/{key}": value for key, value in saved.items()}
        for name, network in self.learner.networks().items():
            tensors |= {f"network.{name}/{key}": value.detach().cpu() for key, value in network.state_dict().items()}
        return tensors, meta

    def load_state(self, state: State) -> None:
        """Go on from a checkpoint's `state()`; CorruptCheckpoint-worthy mismatches raise ValueError or KeyError."""
        tensors, meta = state
        self.updates, self.replayed = int(meta["updates"]), int(meta["replayed"])
        self.last_target_update = int(meta["last_target_update"])
        for name, optimizer in self.learner.optimizers.items():
            saved = _prefixed(tensors, f"optimizer.{name}/")
            optimizer.load_state_dict(optimizer_from_tensors(saved, meta["optimizers"][name]))
        for name, network in self.learner.networks().items():
            network.load_state_dict(_prefixed(tensors, f"network.{name}/"))

    def _everything(self) -> nn.Module:
        """The module and the learner's own networks, as one module (for snapshots)."""
        return nn.ModuleDict({"module": self.module, **self.learner.networks()})


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {key.removeprefix(prefix): value for key, value in tensors.items() if key.startswith(prefix)}
