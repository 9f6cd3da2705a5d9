"""MeanStdFilter: observations normalised by running mean and std, statistics mergeable across servers."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlgate.connectors.batching import batch_items
from rlgate.connectors.connector_v2 import ConnectorV2, is_multi_agent
from rlgate.connectors.env_to_module.latest_observations import get_latest_observations, set_latest_observations
from rlgate.core.spaces import has_form_of, space_struct
from rlgate.core.tree import flatten, map_structure, unbatch

if TYPE_CHECKING:
    from rlgate.episodes import MultiAgentEpisode, SingleAgentEpisode
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


class BoxStats:
    """The statistics of one observation space's Box parts: `global` (as of the last sync) and `delta` (the
    observations seen since), one RunningStats per Box part, in the order `flatten` visits the space."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.shapes = [s.shape for s in flatten(space_struct(space)) if isinstance(s, gym.spaces.Box)]
        self.global_ = [RunningStats.zeros(shape) for shape in self.shapes]
        self.delta = [RunningStats.zeros(shape) for shape in self.shapes]

    def normalise(self, observations: Any, piece: MeanStdFilter) -> Any:
        """Observations [B, ...] of the space, normalised as `piece` says (the statistics updated first, if so)."""
        boxes = iter(range(len(self.shapes)))

        def normalise(space: gym.Space, leaf: Any) -> Any:
            if not isinstance(space, gym.spaces.Box):
                return leaf
            i = next(boxes)
            if piece.update_stats:
                self.delta[i] = self.delta[i].merge(RunningStats.of(leaf))
            stats = self.global_[i].merge(self.delta[i])
            out = np.asarray(leaf, dtype=np.float64)
            if piece.de_mean_to_zero:
                out = out - stats.mean
            if piece.de_std_to_one:
                out = out / (stats.std + 1e-8)
            if piece.clip_by_value is not None:
                out = np.clip(out, -piece.clip_by_value, piece.clip_by_value)
            return out.astype(space.dtype)

        return map_structure(normalise, space_struct(self.space), observations)

    def get_state(self) -> dict[str, Any]:
        return {"global": [s.to_state() for s in self.global_], "delta": [s.to_state() for s in self.delta]}

    def set_state(self, state: dict[str, Any]) -> None:
        self.global_ = [RunningStats.from_state(s) for s in state["global"]]
        self.delta = [RunningStats.from_state(s) for s in state["delta"]]

    def check_state(self, state: Any) -> None:
        """Raise ValueError unless `state` is `get_state`'s form for this space, each statistic fitting."""
        if not isinstance(state, Mapping) or set(state) != {"global", "delta"}:
            raise ValueError(f"a MeanStdFilter state is global and delta, not {_keys(state)}")
        for part in ("global", "delta"):
            if not isinstance(state[part], list | tuple) or len(state[part]) != len(self.shapes):
                raise ValueError(f"{part} must hold statistics for each of the {len(self.shapes)} Box parts")
            for i, (stats, shape) in enumerate(zip(state[part], self.shapes, strict=True)):
                try:
                    RunningStats.check_state(stats, shape)
                except ValueError as exc:
                    raise ValueError(f"{part}[{i}]: {exc}") from exc

    def merged(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """The state with every state's delta added to this global statistics, and no delta."""
        merged = list(self.global_)
        for state in states:
            for i, delta in enumerate(state["delta"]):
                merged[i] = merged[i].merge(RunningStats.from_state(delta))
        return {
            "global": [stats.to_state() for stats in merged],
            "delta": [RunningStats.zeros(stats.mean.shape).to_state() for stats in merged],
        }


class MeanStdFilter(ConnectorV2):
    """Normalise each Box part of the latest observations: (obs - mean) / (std + 1e-8), clipped.

    Each call first adds the batch's observations to the statistics (`update_stats`), then normalises
    the whole batch with them, and writes the filtered observations back into the episodes (as RLlib
    does, so the learner trains on them) and over a batched OBS (the fast path). Non-Box parts of a
    Dict/Tuple observation pass through. RLlib pushes and normalises one observation at a time; here all
    observations of a call are normalised with the statistics after the whole batch, so the result does
    not depend on the order of the episodes.

    Multi-agent (`multi_agent`, RLlib's option of the same name): the spaces are Dicts by agent id, each
    agent has statistics of its own, and the latest observation of each agent that observed at the latest
    env step is normalised in its episode (`agent_ids` limits this to those agents; default: all). A
    terminated agent's last observation repeated by its MultiAgentEpisode (it left without one) was
    normalised already and is left as it is (RLlib normalises it twice).

    Merging across servers is exact for any number of servers and sync rounds: the state holds the
    `global` statistics (as of the last sync) and the `delta` of the observations seen since (multi-agent:
    per agent id), and `merge_states(states)` adds every state's delta to this piece's own global statistics
    (Chan's algorithm). The merging piece must therefore hold the last merged state (set_state it after each
    merge, or restore it from the checkpoint). A sync round: `merged = coordinator.merge_states([s.get_state()
    for s in servers])`, then `set_state(merged)` on the coordinator and every server; observations
    filtered between a server's get_state and its set_state do not enter the statistics (as in RLlib).
    """

    accepts_batched_obs = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        de_mean_to_zero: bool = True,
        de_std_to_one: bool = True,
        clip_by_value: float | None = 10.0,
        update_stats: bool = True,
        multi_agent: bool = False,
        agent_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.de_mean_to_zero = de_mean_to_zero
        self.de_std_to_one = de_std_to_one
        self.clip_by_value = clip_by_value
        self.update_stats = update_stats
        self.multi_agent = multi_agent
        self.agent_ids = agent_ids
        self._stats: dict[Any, BoxStats] | None = None  # by agent id; single-agent: the one under None
        # Multi-agent: the arrays this piece wrote into episodes, while they live. An agent's latest observation
        # can be one of them: the last one repeated for an agent terminated without one, or the latest one of a
        # chunk cut while its step waited for actions (a server's flush runs the pipeline, then the successor's
        # step runs it again). Normalised once, it is left as it is (RLlib normalises those twice).
        self._made: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space, input_action_space: gym.Space | None
    ) -> gym.Space:
        bound = np.inf if self.clip_by_value is None else self.clip_by_value

        def output(sub: gym.Space) -> gym.Space:
            return gym.spaces.Box(-bound, bound, sub.shape, sub.dtype) if isinstance(sub, gym.spaces.Box) else sub

        def normalised(space: gym.Space) -> gym.Space:
            return _space_from_struct(map_structure(output, space_struct(space)))

        if self.multi_agent:
            assert isinstance(input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            return gym.spaces.Dict(
                {
                    agent_id: normalised(space) if self._filters(agent_id) else space
                    for agent_id, space in input_observation_space.spaces.items()
                }
            )
        return normalised(input_observation_space)

    def _filters(self, agent_id: Any) -> bool:
        return self.agent_ids is None or agent_id in self.agent_ids

    def __call__(
        self,
        *,
        rl_module: RLModule | None,
        batch: dict[str, Any],
        episodes: Sequence[SingleAgentEpisode],
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if not episodes:
            return batch
        if is_multi_agent(episodes) != self.multi_agent:
            raise ValueError(
                "MeanStdFilter got MultiAgentEpisodes: set multi_agent = true (RLlib's option)"
                if not self.multi_agent
                else "MeanStdFilter(multi_agent=True) got single-agent episodes"
            )
        if self.multi_agent:
            self._normalise_agents(episodes)
            return batch
        filtered = self._statistics()[None].normalise(get_latest_observations(batch, episodes), self)
        set_latest_observations(batch, episodes, filtered, self.observation_space)
        return batch

    def _normalise_agents(self, episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode]) -> None:
        """Each agent's latest observations (of the agents that observed last), with its own statistics; an
        observation this piece made (see `_made`), or a later piece made of it, is left as it is."""
        by_agent: dict[Any, list[SingleAgentEpisode]] = {}
        assert isinstance(self.input_observation_space, gym.spaces.Dict)  # multi-agent: {agent id: space}
        assert isinstance(self.observation_space, gym.spaces.Dict)
        for episode in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=True):
            agent_id, latest = episode.agent_id, episode.get_observations(-1)
            # Not this piece's output, nor what a later piece made of it (FlattenObservations' flat array).
            fresh = has_form_of(self.input_observation_space[agent_id], latest) and not self._made_by_me(latest)
            if self._filters(agent_id) and fresh:
                by_agent.setdefault(agent_id, []).append(episode)
        for agent_id, agent_episodes in by_agent.items():
            latest = batch_items([episode.get_observations(-1) for episode in agent_episodes])
            filtered = self._statistics()[agent_id].normalise(latest, self)
            space = self.observation_space[agent_id]
            for episode, row in zip(agent_episodes, unbatch(filtered), strict=True):
                self._made.update((id(leaf), leaf) for leaf in flatten(row) if isinstance(leaf, np.ndarray))
                episode.set_observations(new_data=row, at_indices=-1)
                episode.observation_space = space

    def _made_by_me(self, observation: Any) -> bool:
        return any(self._made.get(id(leaf)) is leaf for leaf in flatten(observation) if isinstance(leaf, np.ndarray))

    def get_state(self) -> dict[str, Any]:
        return self._as_state({agent_id: stats.get_state() for agent_id, stats in self._statistics().items()})

    def set_state(self, state: dict[str, Any]) -> None:
        """Take a state of `get_state`'s form; ValueError (`check_state`'s) for any other, e.g. a single-agent
        filter's state given to a multi-agent one (a checkpoint of an earlier spec)."""
        self.check_state(state)
        per_agent = self._per_agent(state)
        for agent_id, stats in self._statistics().items():
            stats.set_state(per_agent[agent_id])

    def reset_state(self) -> None:
        space = self.input_observation_space
        assert space is not None  # set by the pipeline before statistics are asked for
        if not self.multi_agent:
            self._stats = {None: BoxStats(space)}
        else:
            assert isinstance(space, gym.spaces.Dict)  # multi-agent: {agent id: space}
            self._stats = {agent: BoxStats(sub) for agent, sub in space.spaces.items() if self._filters(agent)}

    def check_state(self, state: Any) -> None:
        """Raise ValueError unless `state` is one of this filter's (`get_state`'s form): `global` and `delta`
        statistics for each Box part of its input (multi-agent: per agent id), each fitting
        (`RunningStats.check_state`)."""
        statistics = self._statistics()
        if self.multi_agent and (not isinstance(state, Mapping) or set(state) != set(statistics)):
            raise ValueError(
                f"a multi-agent MeanStdFilter state is keyed by agent {sorted(statistics)}, not {_keys(state)}"
            )
        per_agent = self._per_agent(state)
        for agent_id, stats in statistics.items():
            try:
                stats.check_state(per_agent[agent_id])
            except ValueError as exc:
                if not self.multi_agent:
                    raise
                raise ValueError(f"agent {agent_id!r}: {exc}") from exc

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        per_agent = [self._per_agent(state) for state in states]
        return self._as_state(
            {agent_id: stats.merged([s[agent_id] for s in per_agent]) for agent_id, stats in self._statistics().items()}
        )

    def _statistics(self) -> dict[Any, BoxStats]:
        """The statistics by agent id (single-agent: the one under None), made for the input space at first use
        (the pipeline sets the space after the piece is built)."""
        if self._stats is None:
            self.reset_state()
        assert self._stats is not None  # made by reset_state
        return self._stats

    def _per_agent(self, state: Any) -> Any:
        """A state of `get_state`'s form, by agent id (single-agent: under None)."""
        return state if self.multi_agent else {None: state}

    def _as_state(self, per_agent: dict[Any, Any]) -> Any:
        """`_per_agent`'s inverse: the state's form of statistics by agent id."""
        return per_agent if self.multi_agent else per_agent[None]


def _keys(state: Any) -> str:
    """What a state that should be a dict holds, for an error message: its keys, or its type."""
    return f"keys {sorted(map(str, state))}" if isinstance(state, Mapping) else type(state).__name__


def _space_from_struct(struct: Any) -> gym.Space:
    if isinstance(struct, dict):
        return gym.spaces.Dict({key: _space_from_struct(sub) for key, sub in struct.items()})
    if isinstance(struct, tuple):
        return gym.spaces.Tuple([_space_from_struct(sub) for sub in struct])
    return struct
