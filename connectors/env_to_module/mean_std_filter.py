"""MeanStdFilter: observations normalised by running mean and std, statistics mergeable across servers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.connector_v2 import ConnectorV2
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations
from rlgate.core.spaces import space_struct
from rlgate.core.tree import flatten, map_structure

if TYPE_CHECKING:
    from rlgate.episodes import SingleAgentEpisode
    from rlgate.models import RLModule


@dataclass(frozen=True)
class RunningStats:
    """Count, mean and M2 (sum of squared deviations from the mean) of samples, per element, in float64."""

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> RunningStats:
        return cls(0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def of(cls, samples: np.ndarray) -> RunningStats:
        """The statistics of `samples` [N, ...]."""
        samples = np.asarray(samples, dtype=np.float64)
        mean = samples.mean(axis=0)
        return cls(len(samples), mean, np.square(samples - mean).sum(axis=0))

    def merge(self, other: RunningStats) -> RunningStats:
        """The statistics of both sample sets together (Chan et al.'s parallel algorithm: exact)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / count)
        return RunningStats(count, mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation (ddof=1; 0 below two samples), as RLlib's RunningStat."""
        if self.count < 2:
            return np.zeros_like(self.mean)
        return np.sqrt(self.m2 / (self.count - 1))

    def to_state(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.copy(), "m2": self.m2.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RunningStats:
        return cls(int(state["count"]), np.array(state["mean"], np.float64), np.array(state["m2"], np.float64))

    @staticmethod
    def check_state(state: Any, shape: tuple[int, ...]) -> None:
        """Raise ValueError unless `state` is statistics of this `shape` as `to_state` makes them: a count in
        [0, 2**63), finite float64 mean and M2, and M2 at least 0 (anything else would poison or break merging)."""
        if not isinstance(state, Mapping) or set(state) != {"count", "mean", "m2"}:
            raise ValueError(f"statistics are count, mean and m2, not {_keys(state)}")
        count = np.asarray(state["count"])
        if count.shape != () or count.dtype.kind not in "iu" or not 0 <= count <= np.iinfo(np.int64).max:
            raise ValueError(f"count must be an integer in [0, 2**63), not {count.dtype} of shape {count.shape}")
        mean, m2 = np.asarray(state["mean"]), np.asarray(state["m2"])
        for key, array in (("mean", mean), ("m2", m2)):
            if array.dtype != np.float64 or array.shape != shape:
                raise ValueError(f"{key} must be float64 of shape {shape}, not {array.dtype} of shape {array.shape}")
            if not np.isfinite(array).all():
                raise ValueError(f"{key} is not finite")
        if (m2 < 0).any():
            raise ValueError("m2 is negative")


class MeanStdFilter(ConnectorV2):
    """Normalise each Box part of the latest observations: (obs - mean) / (std + 1e-8), clipped.

    Each call first adds the batch's observations to the statistics (`update_stats`), then normalises
    the whole batch with them, and writes the filtered observations back into the episodes (as RLlib
    does, so the learner trains on them) and over a batched OBS (the fast path). Non-Box parts of a
    Dict/Tuple observation pass through. RLlib pushes and normalises one observation at a time; here all
    observations of a call are normalised with the statistics after the whole batch, so the result does
    not depend on the order of the episodes.

    Merging across servers is exact for any number of servers and sync rounds: the state holds the
    `global` statistics (as of the last sync) and the `delta` of the observations seen since, and
    `merge_states(states)` adds every state's delta to this piece's own global statistics (Chan's
    algorithm). The merging piece must therefore hold the last merged state (set_state it after each
    merge, or restore it from the checkpoint). A sync round: `merged = coordinator.merge_states([s.get_state()
    for s in servers])`, then `set_state(merged)` on the coordinator and every server; observations
    filtered between a server's get_state and its set_state do not enter the statistics (as in RLlib).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        de_mean_to_zero: bool = True,
        de_std_to_one: bool = True,
        clip_by_value: float | None = 10.0,
        update_stats: bool = True,
        **kwargs: Any,
    ) -> None:
        self.de_mean_to_zero = de_mean_to_zero
        self.de_std_to_one = de_std_to_one
        self.clip_by_value = clip_by_value
        self.update_stats = update_stats
        self._global: list[RunningStats] | None = None
        self._delta: list[RunningStats] | None = None
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        bound = np.inf if self.clip_by_value is None else self.clip_by_value

        def output(sub: gym.Space) -> gym.Space:
            return gym.spaces.Box(-bound, bound, sub.shape, sub.dtype) if isinstance(sub, gym.spaces.Box) else sub

        return _space_from_struct(map_structure(output, space_struct(input_observation_space)))

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: list[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if not episodes:
            return batch
        if self._global is None:
            self.reset_state()
        observations = get_latest_observations(batch, episodes)
        boxes = iter(range(len(self._global)))

        def normalise(space: gym.Space, leaf: Any) -> Any:
            if not isinstance(space, gym.spaces.Box):
                return leaf
            i = next(boxes)
            if self.update_stats:
                self._delta[i] = self._delta[i].merge(RunningStats.of(leaf))
            stats = self._global[i].merge(self._delta[i])
            out = np.asarray(leaf, dtype=np.float64)
            if self.de_mean_to_zero:
                out = out - stats.mean
            if self.de_std_to_one:
                out = out / (stats.std + 1e-8)
            if self.clip_by_value is not None:
                out = np.clip(out, -self.clip_by_value, self.clip_by_value)
            return out.astype(space.dtype)

        filtered = map_structure(normalise, space_struct(self.input_observation_space), observations)
        set_latest_observations(batch, episodes, filtered, self.observation_space)
        return batch

    def get_state(self) -> dict[str, Any]:
        if self._global is None:
            self.reset_state()
        return {
            "global": [stats.to_state() for stats in self._global],
            "delta": [stats.to_state() for stats in self._delta],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._global = [RunningStats.from_state(s) for s in state["global"]]
        self._delta = [RunningStats.from_state(s) for s in state["delta"]]

    def reset_state(self) -> None:
        shapes = self._box_shapes()
        self._global = [RunningStats.zeros(shape) for shape in shapes]
        self._delta = [RunningStats.zeros(shape) for shape in shapes]

    def check_state(self, state: Any) -> None:
        """Raise ValueError unless `state` is one of this filter's (`get_state`'s form): `global` and `delta`
        statistics for each Box part of its input, each fitting (`RunningStats.check_state`)."""
        if not isinstance(state, Mapping) or set(state) != {"global", "delta"}:
            raise ValueError(f"a MeanStdFilter state is global and delta, not {_keys(state)}")
        shapes = self._box_shapes()
        for part in ("global", "delta"):
            if not isinstance(state[part], list | tuple) or len(state[part]) != len(shapes):
                raise ValueError(f"{part} must hold statistics for each of the {len(shapes)} Box parts")
            for i, (stats, shape) in enumerate(zip(state[part], shapes, strict=True)):
                try:
                    RunningStats.check_state(stats, shape)
                except ValueError as exc:
                    raise ValueError(f"{part}[{i}]: {exc}") from exc

    def _box_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each Box part of the input observations, which the statistics are kept for."""
        return [s.shape for s in flatten(space_struct(self.input_observation_space)) if isinstance(s, gym.spaces.Box)]

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        if self._global is None:
            self.reset_state()
        merged = list(self._global)
        for state in states:
            for i, delta in enumerate(state["delta"]):
                merged[i] = merged[i].merge(RunningStats.from_state(delta))
        return {
            "global": [stats.to_state() for stats in merged],
            "delta": [RunningStats.zeros(stats.mean.shape).to_state() for stats in merged],
        }


def _keys(state: Any) -> str:
    """What a state that should be a dict holds, for an error message: its keys, or its type."""
    return f"keys {sorted(map(str, state))}" if isinstance(state, Mapping) else type(state).__name__


def _space_from_struct(struct: Any) -> gym.Space:
    if isinstance(struct, dict):
        return gym.spaces.Dict({key: _space_from_struct(sub) for key, sub in struct.items()})
    if isinstance(struct, tuple):
        return gym.spaces.Tuple([_space_from_struct(sub) for sub in struct])
    return struct
