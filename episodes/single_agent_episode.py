"""SingleAgentEpisode: the record of one agent's trajectory in one env, as RLlib 2.60 defines it.

An episode holds n+1 observations and infos and n actions, rewards and extra model outputs (one per
env step), each in an `InfiniteLookbackBuffer` that may start with a lookback of earlier steps (e.g.
from the episode chunk this one continues). Constructor, methods, keyword arguments and defaults follow
RLlib 2.60; see `episodes.infinite_lookback_buffer` for the index semantics of the getters and setters.

rlgate additions and differences: `chunk_index` (0 for a fresh episode, +1 for each `cut()` successor,
carried by `get_state()` and the wire codec) identifies chunks of one long episode; `multi_agent_env_steps`
(an agent's episode: the env steps of the multi-agent chunk it was shipped with, on one agent of each chunk,
else 0; carried by the wire codec) lets the learner count env steps; `multi_agent_episode_chunks` (on the
agents' chunks shipped when their multi-agent episode ended: how many agent chunks it shipped in all, else 0;
carried by the wire codec) lets the learner tell when it has a whole multi-agent episode; `session_closed` (set on
the truncated chunk a server ships when its session ends while the episode runs; carried by the wire codec, and
by `slice()` as the done flags are) tells a cut-off episode from one the env ended; `cut()` and `slice()`
keep `agent_id`, `module_id` and `multi_agent_episode_id`; `to_numpy()` also works on an empty episode and
converts every column of a length-0 one (RLlib's converts only its observations, so `is_numpy` stays False);
precondition failures raise RuntimeError / ValueError instead of AssertionError; `add_env_step` does no
space checks (call `validate()` or check the data where it enters, off the per-step path).
"""

from __future__ import annotations

import builtins
import copy
import time
import uuid
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rlgate.core.tree import first_leaf, flatten, map_structure
from rlgate.episodes.infinite_lookback_buffer import Indices, InfiniteLookbackBuffer

_REWARDS_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)


class SingleAgentEpisode:
    """A (chunk of a) single-agent episode: observations, actions, rewards, infos, extra model outputs."""

    __slots__ = (
        "_action_space",
        "_custom_data",
        "_last_step_time",
        "_observation_space",
        "_start_time",
        "actions",
        "agent_id",
        "chunk_index",
        "extra_model_outputs",
        "id_",
        "infos",
        "is_terminated",
        "is_truncated",
        "module_id",
        "multi_agent_env_steps",
        "multi_agent_episode_chunks",
        "multi_agent_episode_id",
        "observations",
        "rewards",
        "session_closed",
        "t",
        "t_started",
    )

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list | InfiniteLookbackBuffer | Any | None = None,
        observation_space: gym.Space | None = None,
        infos: list[dict] | InfiniteLookbackBuffer | None = None,
        actions: list | InfiniteLookbackBuffer | Any | None = None,
        action_space: gym.Space | None = None,
        rewards: list[SupportsFloat] | InfiniteLookbackBuffer | Any | None = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
        t_started: int | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_id: Any = None,
        module_id: str | None = None,
        multi_agent_episode_id: str | None = None,
    ):
        """Build an episode, optionally from data already collected.

        Data given as lists (or arrays) is split by `len_lookback_buffer`: its first that many steps
        form the lookback ("auto": all given rewards are lookback, so the episode has length 0 and
        continues at `t_started`). Data given as `InfiniteLookbackBuffer`s is used as is.
        """
        self.id_ = id_ or uuid.uuid4().hex
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id
        self.chunk_index = 0
        self.multi_agent_env_steps = 0
        self.multi_agent_episode_chunks = 0
        self.session_closed = False

        len_rewards = _count(rewards)
        if isinstance(len_lookback_buffer, str) or len_lookback_buffer > len_rewards:  # "auto"
            len_lookback_buffer = len_rewards
        if not isinstance(infos, InfiniteLookbackBuffer) and not infos:
            infos = [{} for _ in range(_count(observations))]
            if isinstance(observations, InfiniteLookbackBuffer):
                infos = InfiniteLookbackBuffer(infos, lookback=observations.lookback)

        self.observations = _as_buffer(observations, len_lookback_buffer)
        self.observation_space = observation_space
        self.infos = _as_buffer(infos, len_lookback_buffer)
        self.actions = _as_buffer(actions, len_lookback_buffer)
        self.action_space = action_space
        self.rewards = _as_buffer(rewards, len_lookback_buffer, _REWARDS_SPACE)
        self.extra_model_outputs = {
            key: _as_buffer(value, len_lookback_buffer) for key, value in (extra_model_outputs or {}).items()
        }
        self.is_terminated = terminated
        self.is_truncated = truncated
        self.t_started = t_started or 0
        self.t = len(self.rewards) + self.t_started

        self._custom_data: dict[str, Any] = {}
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self.validate()

    # --- building -----------------------------------------------------------------------------------

    def add_env_reset(self, observation: Any, infos: dict | None = None) -> None:
        """Record the observation (and infos) of `env.reset()`: the first data of a fresh episode."""
        if self.is_reset or self.is_done or self.t != 0 or self.t_started != 0:
            raise RuntimeError(f"add_env_reset() needs a fresh episode; {self!r} already has data")
        self.observations.append(observation)
        self.infos.append(infos or {})
        self._start_time = time.perf_counter()

    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: SupportsFloat,
        infos: dict[str, Any] | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None:
        """Record one env step: the action taken (and the model's extra outputs for it), then the env's
        next observation, reward, infos and done flags. O(1); called once per env step, so no checks
        beyond "not done" (see `validate()`).
        """
        if self.is_terminated or self.is_truncated:
            raise RuntimeError(f"episode {self.id_} is done: no data can be added to it")
        self.observations.append(observation)
        self.actions.append(action)
        self.rewards.append(reward)
        self.infos.append(infos or {})
        self.t += 1
        if extra_model_outputs:
            buffers = self.extra_model_outputs
            for key, value in extra_model_outputs.items():
                buffer = buffers.get(key)
                if buffer is None:
                    buffers[key] = InfiniteLookbackBuffer([value])
                else:
                    buffer.append(value)
        self.is_terminated = terminated
        self.is_truncated = truncated
        self._last_step_time = time.perf_counter()
        if self._start_time is None:
            self._start_time = self._last_step_time

    def validate(self) -> None:
        """Raise ValueError unless the columns have consistent lengths (n+1 observations/infos, n of the
        rest, lookbacks excluded)."""
        n_obs = len(self.observations)
        n_steps = max(n_obs - 1, 0)
        columns = [("infos", self.infos, n_obs), ("actions", self.actions, n_steps), ("rewards", self.rewards, n_steps)]
        columns += [(f"extra_model_outputs[{k!r}]", b, n_steps) for k, b in self.extra_model_outputs.items()]
        wrong = [f"{len(buffer)} {name} (expected {n})" for name, buffer, n in columns if len(buffer) != n]
        if wrong:
            raise ValueError(f"episode {self.id_} has {n_obs} observations but " + ", ".join(wrong))

    def to_numpy(self) -> SingleAgentEpisode:
        """Convert observations, actions, rewards and extra model outputs to numpy arrays (infos stay a
        list). Appending keeps working afterwards, amortised O(1). Returns self."""
        self.validate()
        self.observations.finalize()
        self.actions.finalize()
        self.rewards.finalize()
        for buffer in self.extra_model_outputs.values():
            buffer.finalize()
        return self

    def concat_episode(self, other: SingleAgentEpisode) -> None:
        """Append `other` (the chunk that continues this one: same id, `other.t_started == self.t`,
        its first observation equal to our last) to this episode, in place."""
        if other.id_ != self.id_:
            raise ValueError(f"cannot concat episode {other.id_} to episode {self.id_}")
        if self.is_done:
            raise RuntimeError(f"episode {self.id_} is done: nothing can follow it")
        if self.t != other.t_started:
            raise ValueError(f"chunk starts at t={other.t_started}, this episode ends at t={self.t}")
        self.validate()
        other.validate()
        last, first = self.observations[-1], other.observations[0]
        if not all(flatten(map_structure(np.array_equal, first, last))):
            raise ValueError("the chunk's first observation differs from this episode's last one")
        missing = set(other.extra_model_outputs) - set(self.extra_model_outputs)
        if missing and self.actions.len_incl_lookback():
            raise ValueError(f"extra model outputs {sorted(missing)} are not in this episode")
        for key in missing:  # no step here yet (a multi-agent agent's first action hung): the chunk's start them
            self.extra_model_outputs[key] = InfiniteLookbackBuffer()

        self.observations.pop()
        self.infos.pop()
        self.observations.extend(other.get_observations())
        self.infos.extend(other.get_infos())
        self.actions.extend(other.get_actions())
        self.rewards.extend(other.get_rewards())
        for key in other.extra_model_outputs:
            self.extra_model_outputs[key].extend(other.get_extra_model_outputs(key))
            if self.actions.finalized:
                self.extra_model_outputs[key].finalize()
        self.t = other.t
        if other.is_terminated:
            self.is_terminated = True
        elif other.is_truncated:
            self.is_truncated = True
        self.custom_data.update(other.custom_data)
        self.validate()

    def cut(self, len_lookback_buffer: int = 0) -> SingleAgentEpisode:
        """Start the successor chunk (length 0, same id, `t_started = self.t`, `chunk_index + 1`).

        Its observations start with our last observation; with `len_lookback_buffer > 0` it also gets
        up to that many of our last steps (lookback included) as its lookback. `custom_data` is copied.
        """
        if self.is_done:
            raise RuntimeError(f"episode {self.id_} is done: it has no successor")
        if len_lookback_buffer < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {len_lookback_buffer}")
        obs_and_infos = slice(-len_lookback_buffer - 1, None)
        rest = slice(-len_lookback_buffer, None) if len_lookback_buffer > 0 else slice(None, 0)
        successor = SingleAgentEpisode(
            id_=self.id_,
            observations=self.get_observations(obs_and_infos),
            observation_space=self.observation_space,
            infos=self.get_infos(obs_and_infos),
            actions=self.get_actions(rest),
            action_space=self.action_space,
            rewards=self.get_rewards(rest),
            extra_model_outputs={key: self.get_extra_model_outputs(key, rest) for key in self.extra_model_outputs},
            t_started=self.t,
            len_lookback_buffer="auto",
            agent_id=self.agent_id,
            module_id=self.module_id,
            multi_agent_episode_id=self.multi_agent_episode_id,
        )
        successor.chunk_index = self.chunk_index + 1
        successor._custom_data = copy.deepcopy(self.custom_data)
        return successor

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> SingleAgentEpisode:
        """A new episode with steps `slice_` of this one (step 1 only; indices exclude the lookback).

        Its lookback holds up to `len_lookback_buffer` earlier steps (default: as many as ours), taken
        from our lookback where the slice starts near 0. Done flags are kept only if the slice reaches
        our end.
        """
        if slice_.step not in (None, 1):
            raise ValueError(f"episode slices need step 1, got {slice_.step}")
        start = 0 if slice_.start is None else slice_.start
        start = start + len(self) if start < 0 else start
        stop = len(self) if slice_.stop is None else slice_.stop
        stop = stop + len(self) if stop < 0 else stop
        keep_done = stop == len(self)

        def part(buffer: InfiniteLookbackBuffer, extra: int, space: gym.Space | None = None):
            lookback = buffer.lookback if len_lookback_buffer is None else len_lookback_buffer
            if start >= 0:
                lookback = min(lookback, buffer.lookback + start)
            data = buffer.get(slice(start - lookback, stop + extra), neg_index_as_lookback=True)
            return InfiniteLookbackBuffer(data, lookback=lookback, space=space)

        episode = SingleAgentEpisode(
            id_=self.id_,
            observations=part(self.observations, 1, self.observation_space),
            observation_space=self.observation_space,
            infos=part(self.infos, 1),
            actions=part(self.actions, 0, self.action_space),
            action_space=self.action_space,
            rewards=part(self.rewards, 0, _REWARDS_SPACE),
            extra_model_outputs={key: part(buffer, 0) for key, buffer in self.extra_model_outputs.items()},
            terminated=self.is_terminated and keep_done,
            truncated=self.is_truncated and keep_done,
            t_started=self.t_started + start,
            agent_id=self.agent_id,
            module_id=self.module_id,
            multi_agent_episode_id=self.multi_agent_episode_id,
        )
        episode.chunk_index = self.chunk_index
        episode.session_closed = self.session_closed and keep_done
        return episode

    def __getitem__(self, item: builtins.slice) -> SingleAgentEpisode:
        """`episode[a:b]` is `episode.slice(slice(a, b))`; only slices are supported."""
        if not isinstance(item, slice):
            raise NotImplementedError(f"SingleAgentEpisode supports only slices (episode[a:b]), got {item!r}")
        return self.slice(item)

    # --- getters and setters ------------------------------------------------------------------------

    def get_observations(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Observations at `indices` (see `InfiniteLookbackBuffer.get`); None: all after the lookback."""
        return self.observations.get(
            indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill, one_hot_discrete=one_hot_discrete
        )

    def get_infos(self, indices: Indices = None, *, neg_index_as_lookback: bool = False, fill: Any = None) -> Any:
        """Info dicts at `indices` (see `InfiniteLookbackBuffer.get`)."""
        return self.infos.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_actions(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Actions at `indices` (see `InfiniteLookbackBuffer.get`)."""
        return self.actions.get(
            indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill, one_hot_discrete=one_hot_discrete
        )

    def get_rewards(
        self, indices: Indices = None, *, neg_index_as_lookback: bool = False, fill: float | None = None
    ) -> Any:
        """Rewards at `indices` (see `InfiniteLookbackBuffer.get`)."""
        return self.rewards.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_extra_model_outputs(
        self, key: str, indices: Indices = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Extra model output `key` (e.g. Columns.ACTION_LOGP) at `indices`."""
        return self.extra_model_outputs[key].get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def set_observations(self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite observations in place (see `InfiniteLookbackBuffer.set`)."""
        self.observations.set(new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

    def set_actions(self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite actions in place (see `InfiniteLookbackBuffer.set`)."""
        self.actions.set(new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

    def set_rewards(self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite rewards in place (see `InfiniteLookbackBuffer.set`)."""
        self.rewards.set(new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

    def set_extra_model_outputs(
        self, *, key: str, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite the existing extra model output `key` in place (see `InfiniteLookbackBuffer.set`)."""
        if key not in self.extra_model_outputs:
            raise KeyError(f"episode {self.id_} has no extra model output {key!r}")
        self.extra_model_outputs[key].set(new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

    # --- properties and summaries -------------------------------------------------------------------

    @property
    def observation_space(self) -> gym.Space | None:
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: gym.Space | None) -> None:
        self._observation_space = self.observations.space = value

    @property
    def action_space(self) -> gym.Space | None:
        return self._action_space

    @action_space.setter
    def action_space(self, value: gym.Space | None) -> None:
        self._action_space = self.actions.space = value

    @property
    def custom_data(self) -> dict[str, Any]:
        """Free-form per-episode data for user code (copied into `cut()` successors)."""
        return self._custom_data

    @property
    def is_reset(self) -> bool:
        """True once the episode has an observation."""
        return self.observations.len_incl_lookback() > self.observations.lookback

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def is_numpy(self) -> bool:
        """True after `to_numpy()` (or when built from arrays)."""
        return self.rewards.finalized

    def __len__(self) -> int:
        """Number of env steps in this episode (chunk), lookback excluded."""
        return self.t - self.t_started

    def env_steps(self) -> int:
        return len(self)

    def agent_steps(self) -> int:
        return len(self)

    def get_return(self) -> float:
        """Sum of the rewards after the lookback."""
        return float(np.sum(self.get_rewards()))

    def get_duration_s(self) -> float:
        """Wall-clock seconds from the reset (or first step) to the last step; 0.0 before any step."""
        if self._last_step_time is None or self._start_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def __repr__(self) -> str:
        return f"SAEps(len={len(self)} done={self.is_done} R={self.get_return()} id_={self.id_})"

    # --- state --------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The episode as a plain dict (RLlib's keys plus "chunk_index"; spaces stay gymnasium objects,
        data is shared, not copied); `from_state` rebuilds it."""
        return {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "chunk_index": self.chunk_index,
            "observations": self.observations.get_state(),
            "actions": self.actions.get_state(),
            "rewards": self.rewards.get_state(),
            "infos": self.infos.get_state(),
            "extra_model_outputs": {key: buffer.get_state() for key, buffer in self.extra_model_outputs.items()},
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "_observation_space": self.observation_space,
            "_action_space": self.action_space,
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self.custom_data,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> SingleAgentEpisode:
        """Rebuild an episode from `get_state()`'s dict."""
        extra = state.get("extra_model_outputs") or {}
        episode = SingleAgentEpisode(
            state["id_"],
            observations=InfiniteLookbackBuffer.from_state(state["observations"]),
            observation_space=state["_observation_space"],
            infos=InfiniteLookbackBuffer.from_state(state["infos"]),
            actions=InfiniteLookbackBuffer.from_state(state["actions"]),
            action_space=state["_action_space"],
            rewards=InfiniteLookbackBuffer.from_state(state["rewards"]),
            extra_model_outputs={key: InfiniteLookbackBuffer.from_state(value) for key, value in extra.items()},
            terminated=state["is_terminated"],
            truncated=state["is_truncated"],
            t_started=state["t_started"],
            agent_id=state["agent_id"],
            module_id=state["module_id"],
            multi_agent_episode_id=state["multi_agent_episode_id"],
        )
        episode.chunk_index = state.get("chunk_index", 0)
        episode.t = state["t"]
        episode._start_time = state["_start_time"]
        episode._last_step_time = state["_last_step_time"]
        episode._custom_data = state.get("custom_data", {})
        return episode


def _count(data: Any) -> int:
    """Number of items in constructor data (a buffer counts its lookback too)."""
    if data is None:
        return 0
    if isinstance(data, InfiniteLookbackBuffer):
        return data.len_incl_lookback()
    if isinstance(data, list):
        return len(data)
    return len(first_leaf(data))


def _as_buffer(data: Any, lookback: int, space: gym.Space | None = None) -> InfiniteLookbackBuffer:
    if isinstance(data, InfiniteLookbackBuffer):
        return data
    return InfiniteLookbackBuffer(data, lookback=lookback, space=space)
