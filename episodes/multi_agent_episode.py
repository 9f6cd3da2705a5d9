"""MultiAgentEpisode: one multi-agent env episode as one SingleAgentEpisode per agent, as RLlib 2.60 defines it.

Agents act at different times (turn-based games, agents that join late or leave early). The env clock
counts `env.reset()` as env step 0 and every `env.step()` as one more; each agent has its own clock (its
SingleAgentEpisode's steps). `env_t_to_agent_t[agent]` maps env steps to that agent's steps, with
`SKIP_ENV_TS_TAG` ("S") where the agent did not observe. An agent that acted but has not observed since
has a "hanging" action (with its extra model outputs and the rewards it received meanwhile): its step
completes, rewards summed into it, when its next observation arrives, or with a copy of its last
observation when it is terminated without one (RLlib's "CASE 1-4" in `add_env_step`).

Getters take env-step indices (`env_steps=True`, the default: only agents that observed at an index
answer, unless `fill` is given) or agent-step indices (`env_steps=False`), with the lookback and `fill`
semantics of `InfiniteLookbackBuffer`; actions, rewards and extra model outputs include the hanging ones.

Deliberate differences from RLlib 2.60, where it loses data or contradicts itself:
- `cut()` keeps an agent with a hanging action: its successor chunk starts at the agent's last
  observation with the hanging action, outputs and rewards, so the pending step completes in the
  successor (RLlib drops the step and restarts the agent as if it had just appeared). Each agent's
  successor SingleAgentEpisode keeps its id and takes `chunk_index + 1`.
- An agent that first observes in a successor chunk is mapped from the chunk's start (its lookback is skip
  tags): RLlib counts its skip tags from the episode's reset (`env_t`, not `env_t - env_t_started`), which
  puts its steps at later env steps than they happened unless the chunk's lookback equals `env_t_started`.
- `cut()` extends the env-step lookback back to the last observation of every agent whose action hangs for every
  `len_lookback_buffer`, 0 included: RLlib's loop reads index -0 (the chunk's first entry) first, so with 0 it
  extends only for an agent that was absent at the chunk's start.
- `cut()` carries the rewards of agents that have not observed yet into the successor's `_hanging_rewards_begin`,
  and `concat_episode()` takes the successor's (summed further, or cleared where the agent left unobserved): RLlib
  copies the hanging end rewards there (counted twice by `get_return(include_hanging_rewards=True)`) and keeps the
  first chunk's in a concatenation.
- `cut(len_lookback_buffer)` keeps at most the env steps that exist as env-step lookback: RLlib pads its
  env-step mappings to the full length with skip tags, so an index before the episode's reset answers `{}`
  there and raises IndexError here (as for a single-agent episode).
- `get_truncateds()["__all__"]` is `is_truncated` (RLlib reports `is_terminated` there).
- When the last agents leave, each keeps its own flags (and gets those of `"__all__"` the env sent): RLlib
  also marks the episode terminated then, and passes that on to every agent in the step, so an agent only
  truncated (a time limit) became terminated as well, and its value was not bootstrapped.
- With `env_steps=False` the hanging value counts for every index form (RLlib drops it for indices=None).
- The constructor records RLlib's per-env-step lists as `add_env_reset` / `add_env_step` would, so its episodes
  are those the env steps build: a step whose observations straddle the chunk's start (the agent observed in
  the lookback, then only after it) belongs to the chunk, as in a `cut()` successor (RLlib's constructor puts
  it in the lookback, where no chunk holds it); env_t counts the observations (RLlib counts the rewards, one
  more when a last rewards dict follows the last observations); rewards before an agent's first observation
  are kept as in `add_env_step` (RLlib drops them); a finished episode completes the steps still hanging
  (RLlib leaves them hanging); `terminateds=True` ends every agent (RLlib raises AttributeError).
- `slice()` works per agent on env-step boundaries (see its docstring).
- Precondition failures raise `MultiAgentEnvError` (a ValueError) or RuntimeError, not AssertionError.
- An agent's rewards summed between two of its steps must stay finite as float32 (the dtype episodes store
  rewards in): else `MultiAgentEnvError`.
"""

from __future__ import annotations

import builtins
import copy
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.agents_step import ALL
from rlgate.core.space_check import finite_as_float32
from rlgate.core.tree import batch, map_structure
from rlgate.episodes.infinite_lookback_buffer import Indices, InfiniteLookbackBuffer
from rlgate.episodes.single_agent_episode import SingleAgentEpisode

DEFAULT_MODULE_ID = "default_policy"

AgentID = Any
ModuleID = str
MappingFn = Callable[[AgentID, "MultiAgentEpisode"], ModuleID]


class MultiAgentEnvError(ValueError):
    """A multi-agent env step that breaks the episode's rules (e.g. data for an agent that is done)."""


class RewardSumNotFinite(MultiAgentEnvError):
    """An agent's rewards between two of its steps sum to more than float32 holds: a non-finite reward."""


def default_agent_to_module_mapping_fn(agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
    """RLlib's default mapping: every agent acts with the one shared module, "default_policy"."""
    return DEFAULT_MODULE_ID


class MultiAgentEpisode:
    """A (chunk of a) multi-agent episode: per-agent SingleAgentEpisodes on one env clock."""

    SKIP_ENV_TS_TAG = "S"

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list[dict[AgentID, Any]] | None = None,
        observation_space: gym.spaces.Dict | dict | None = None,
        infos: list[dict[AgentID, dict]] | None = None,
        actions: list[dict[AgentID, Any]] | None = None,
        action_space: gym.spaces.Dict | dict | None = None,
        rewards: list[dict[AgentID, float]] | None = None,
        terminateds: dict[AgentID, bool] | bool = False,
        truncateds: dict[AgentID, bool] | bool = False,
        extra_model_outputs: list[dict[AgentID, dict]] | None = None,
        env_t_started: int | None = None,
        agent_t_started: dict[AgentID, int] | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_episode_ids: dict[AgentID, str] | None = None,
        agent_episodes: dict[AgentID, SingleAgentEpisode] | None = None,
        agent_module_ids: dict[AgentID, ModuleID] | None = None,
        agent_to_module_mapping_fn: MappingFn | None = None,
    ) -> None:
        """An empty episode (call `add_env_reset`), one continuing at `env_t_started`, or one built from RLlib's
        per-env-step lists.

        `agent_module_ids` fixes modules of agents up front; other agents are mapped by
        `agent_to_module_mapping_fn(agent_id, episode)` (default: all to "default_policy") when they first
        appear, and keep that module for the whole episode.

        The lists, as RLlib takes them: `observations[i]` (and `infos[i]`) what the env returned at env step i
        (the reset first), `actions[i]` (and `extra_model_outputs[i]`) what the agents that observed there sent,
        `rewards[i]` what the env step after it gave (a last entry after the last observations is summed into
        the actions still hanging). They are recorded as `add_env_reset` / `add_env_step` would record them;
        an agent that observes and does not act while the lists go on is done there (terminated, or truncated
        if `truncateds` says so), and later rewards for it are ignored (as in RLlib); `terminateds` /
        `truncateds` (per agent and `"__all__"`, or a bool for the episode) are the flags at the end. The first
        `len_lookback_buffer` env steps ("auto": all given rewards) are lookback, and this chunk starts at
        `env_t_started`; each agent's steps that complete in the lookback are its lookback, and its first step
        after them is `agent_t_started[agent]` (default 0). `agent_episode_ids` names the agents' episodes.
        """
        self.id_ = id_ or uuid.uuid4().hex
        self.agent_to_module_mapping_fn = agent_to_module_mapping_fn or default_agent_to_module_mapping_fn
        self._agent_to_module_mapping: dict[AgentID, ModuleID] = dict(agent_module_ids or {})
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        self.env_t_started = env_t_started or 0
        self.env_t = self.env_t_started
        self.agent_t_started: dict[AgentID, int] = defaultdict(int)
        self.env_t_to_agent_t: dict[AgentID, InfiniteLookbackBuffer] = {}
        self._hanging_actions_end: dict[AgentID, Any] = {}
        self._hanging_extra_model_outputs_end: dict[AgentID, dict] = defaultdict(dict)
        self._hanging_rewards_end: dict[AgentID, float] = defaultdict(float)
        self._hanging_rewards_begin: dict[AgentID, float] = defaultdict(float)
        self.is_terminated = False
        self.is_truncated = False
        self.agent_episodes: dict[AgentID, SingleAgentEpisode] = dict(agent_episodes or {})
        for agent_id, episode in self.agent_episodes.items():
            if episode.module_id is not None:  # else mapped when first asked (`module_for`)
                self._agent_to_module_mapping.setdefault(agent_id, episode.module_id)
            self.agent_t_started[agent_id] = episode.t_started
        self.custom_data: dict[str, Any] = {}
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        final = [flags if isinstance(flags, dict) else {ALL: flags} for flags in (terminateds, truncateds)]
        if observations is None:
            if any(x for x in (infos, actions, rewards, extra_model_outputs)):
                raise ValueError("infos, actions, rewards and extra_model_outputs come with observations")
            self.is_terminated, self.is_truncated = (bool(flags.get(ALL)) for flags in final)
            return
        if agent_episodes:
            raise ValueError("give observations (RLlib's per-env-step lists) or agent_episodes, not both")
        self.env_t_started = self.env_t = 0  # recorded from the reset on, then moved to `env_t_started`
        self._record_lists(observations, infos, actions, rewards, extra_model_outputs, *final)
        lookback = len(rewards or []) if isinstance(len_lookback_buffer, str) else len_lookback_buffer  # "auto"
        self._split_lookback(min(lookback, len(observations) - 1), env_t_started or 0, agent_t_started or {})
        for agent_id, episode_id in (agent_episode_ids or {}).items():
            if agent_id in self.agent_episodes:
                self.agent_episodes[agent_id].id_ = episode_id
        self.validate()

    def _record_lists(
        self,
        observations: list[dict],
        infos: list[dict] | None,
        actions: list[dict] | None,
        rewards: list[dict] | None,
        extra_model_outputs: list[dict] | None,
        terminateds: dict,
        truncateds: dict,
    ) -> None:
        """RLlib's per-env-step lists, recorded by `add_env_reset` and `add_env_step` (see `__init__`)."""
        n = len(observations)
        actions, rewards, outputs = actions or [], rewards or [], extra_model_outputs or [{}] * (n - 1)
        infos = infos or [{}] * n
        lengths = {"actions": (len(actions), (n - 1,)), "rewards": (len(rewards), (0, n - 1, n))}
        lengths |= {"extra_model_outputs": (len(outputs), (n - 1,)), "infos": (len(infos), (n,))}
        wrong = [f"{len_} {name}" for name, (len_, fits) in lengths.items() if len_ not in fits and (n > 1 or len_)]
        if n == 0 or wrong:
            raise ValueError(
                f"MultiAgentEpisode: {n} observations (env steps 0..{n - 1}) take one actions dict per env.step() "
                f"({n - 1}), rewards likewise (or one more), infos one per observation; got {', '.join(wrong)}"
            )
        # RLlib: an agent that observes and does not act while the lists go on is done at that observation.
        leaves = [{a for a in observations[i] if i < n - 1 and a not in actions[i]} for i in range(n)]
        self.add_env_reset(
            observations={a: o for a, o in observations[0].items() if a not in leaves[0]}, infos=infos[0]
        )
        for i in range(1, n):
            obs, acted = observations[i], actions[i - 1]
            done = {a for a, e in self.agent_episodes.items() if e.is_done}
            step_rewards = {a: 0.0 for a in obs if a in acted} | {
                a: r for a, r in (rewards[i - 1] if rewards else {}).items() if a not in done
            }
            terminated = {a: True for a in leaves[i] if not truncateds.get(a)}
            truncated = {a: True for a in leaves[i] if truncateds.get(a)}
            if i == n - 1:
                terminated, truncated = terminated | terminateds, truncated | truncateds
            self.add_env_step(
                obs,
                acted,
                step_rewards,
                infos[i],
                terminateds=terminated,
                truncateds=truncated,
                extra_model_outputs=outputs[i - 1],
            )
        if len(rewards) == n:  # rewards after the last observations: for the actions still hanging
            for agent_id, reward in rewards[-1].items():
                if agent_id in self._hanging_actions_end:
                    self._hanging_rewards_end[agent_id] = _summed(agent_id, self._hanging_rewards_end[agent_id], reward)
        if n == 1:
            self.is_terminated, self.is_truncated = bool(terminateds.get(ALL)), bool(truncateds.get(ALL))

    def _split_lookback(self, lookback: int, env_t_started: int, agent_t_started: dict[AgentID, int]) -> None:
        """Make the first `lookback` recorded env steps lookback and start this chunk at `env_t_started`: each
        agent's steps that complete there become its lookback (a step whose observations straddle the chunk's
        start completes in it), its first step after them is `agent_t_started[agent]` (default 0)."""
        self.env_t_started, self.env_t = env_t_started, env_t_started + self.env_t - lookback
        for agent_id, mapping in self.env_t_to_agent_t.items():
            episode = self.agent_episodes[agent_id]
            observed = sum(t != self.SKIP_ENV_TS_TAG for t in mapping.data[: lookback + 1])
            agent_lookback = max(observed - 1, 0)
            t_started = agent_t_started.get(agent_id, 0)
            mapping.data = [t if t == self.SKIP_ENV_TS_TAG else t - agent_lookback + t_started for t in mapping.data]
            mapping.lookback = lookback
            for buffer in (episode.observations, episode.infos, episode.actions, episode.rewards):
                buffer.lookback = agent_lookback
            for buffer in episode.extra_model_outputs.values():
                buffer.lookback = agent_lookback
            episode.t_started, episode.t = t_started, t_started + len(episode.rewards)
            self.agent_t_started[agent_id] = t_started

    # --- building -----------------------------------------------------------------------------------

    def add_env_reset(self, *, observations: dict[AgentID, Any], infos: dict[AgentID, dict] | None = None) -> None:
        """Record `env.reset()`: the agents in `observations` start their episodes (env step 0)."""
        if self.is_done or self.env_t != 0 or self.env_t_started != 0 or self.is_reset:
            raise RuntimeError(f"add_env_reset() needs a fresh episode; {self!r} already has data")
        infos = infos or {}
        for agent_id, observation in observations.items():
            self.env_t_to_agent_t[agent_id] = InfiniteLookbackBuffer([0])
            self.agent_episodes[agent_id] = self._new_agent_episode(agent_id)
            self.agent_episodes[agent_id].add_env_reset(observation, infos.get(agent_id))
        self._start_time = time.perf_counter()

    def add_env_step(
        self,
        observations: dict[AgentID, Any],
        actions: dict[AgentID, Any],
        rewards: dict[AgentID, float],
        infos: dict[AgentID, dict] | None = None,
        *,
        terminateds: dict[AgentID, bool] | None = None,
        truncateds: dict[AgentID, bool] | None = None,
        extra_model_outputs: dict[AgentID, dict] | None = None,
    ) -> None:
        """Record one `env.step()`: the actions the agents took (those that observed last time), then the
        env's observations (agents that act next), rewards (any agent), infos and done flags (per agent
        and `"__all__"`). Raises MultiAgentEnvError for data that breaks the rules, having changed nothing."""
        self.check_env_step(
            observations,
            actions,
            rewards,
            infos,
            terminateds=terminateds,
            truncateds=truncateds,
            extra_model_outputs=extra_model_outputs,
        ).record()

    def check_env_step(
        self,
        observations: dict[AgentID, Any],
        actions: dict[AgentID, Any],
        rewards: dict[AgentID, float],
        infos: dict[AgentID, dict] | None = None,
        *,
        terminateds: dict[AgentID, bool] | None = None,
        truncateds: dict[AgentID, bool] | None = None,
        extra_model_outputs: dict[AgentID, dict] | None = None,
    ) -> CheckedEnvStep:
        """`add_env_step`'s checks alone (MultiAgentEnvError), changing nothing: the step, to `record()` later.

        So a caller can check the steps of several episodes (a message's sub-envs) and record all or none.
        Nothing else may change this episode between the check and the record."""
        if self.is_done:
            raise MultiAgentEnvError(f"episode {self.id_} is done: add_env_step() cannot continue it")
        infos, extra_model_outputs = infos or {}, extra_model_outputs or {}
        terminateds, truncateds = terminateds or {}, truncateds or {}
        all_terminated, all_truncated = bool(terminateds.get(ALL, False)), bool(truncateds.get(ALL, False))
        done = {a for a, e in self.agent_episodes.items() if e.is_done}
        done |= {a for flags in (terminateds, truncateds) for a, flag in flags.items() if flag and a != ALL}
        # RLlib: all agents done, some terminated and some truncated, ends the episode as terminated.
        every_agent_done = bool(self.agent_episodes) and all(a in done for a in self.agent_episodes)
        ends = all_terminated or all_truncated or every_agent_done
        everyone = set(self.agent_episodes) if ends else set()
        with_data = set(observations) | set(actions) | set(rewards) | set(terminateds) | set(truncateds) | everyone
        agent_steps = []
        for agent_id in sorted(with_data - {ALL}, key=str):
            own_truncated = bool(truncateds.get(agent_id, False))
            # The episode's end, as RLlib passes it to every agent of the step, except to an agent truncated in it:
            # that one stays truncated only (RLlib marks it terminated too, and its value would not be bootstrapped).
            # An agent that only appears now ends terminated, so it never joins the finished episode (as in RLlib).
            terminated = bool(terminateds.get(agent_id, False)) or all_terminated
            terminated = terminated or (every_agent_done and not own_truncated)
            agent_steps.append(
                self._check_agent_step(
                    agent_id,
                    observations,
                    actions,
                    rewards,
                    infos.get(agent_id),
                    terminated,
                    own_truncated or all_truncated,
                    extra_model_outputs.get(agent_id),
                )
            )
        return CheckedEnvStep(
            self,
            observations,
            terminated=all_terminated or every_agent_done,
            truncated=all_truncated,
            agent_steps=[step for step in agent_steps if step is not None],
        )

    def _check_agent_step(
        self,
        agent_id: AgentID,
        observations: dict,
        actions: dict,
        rewards: dict,
        info: dict | None,
        terminated: bool,
        truncated: bool,
        outputs: dict | None,
    ) -> _AgentStep | None:
        """One agent's part of an env step (RLlib's four cases), checked: what recording it does (None:
        nothing). Reads this episode, changes nothing."""
        episode = self.agent_episodes.get(agent_id)
        observation, action, reward = observations.get(agent_id), actions.get(agent_id), rewards.get(agent_id)
        if episode is not None and episode.is_done:
            if any(v is not None for v in (observation, action, reward, info, outputs)):
                raise MultiAgentEnvError(f"agent {agent_id!r} is done but got data in a later step")
            return None
        reward = float(reward or 0.0)
        flags = {"terminated": terminated, "truncated": truncated}
        hanging = self._hanging_actions_end.get(agent_id)
        if observation is not None and action is not None:  # case 1: a whole step in one env step
            if episode is None:
                raise MultiAgentEnvError(f"agent {agent_id!r} acted before it ever observed")
            if agent_id not in rewards:
                raise MultiAgentEnvError(f"agent {agent_id!r} acted and observed again but got no reward")
            return _AgentStep(agent_id, "step", observation, action, reward, info, outputs, **flags)
        if observation is not None:  # case 2: completes a hanging action, or the agent's first observation
            if hanging is not None:
                reward = _summed(agent_id, self._hanging_rewards_end.get(agent_id, 0.0), reward)
                outputs = self._hanging_extra_model_outputs_end.get(agent_id)
                return _AgentStep(agent_id, "step", observation, hanging, reward, info, outputs, settles=True, **flags)
            if terminated or truncated:  # appears and leaves at once: never part of the episode
                return _AgentStep(agent_id, "forget")
            if episode is not None:
                raise MultiAgentEnvError(f"agent {agent_id!r} observed twice without acting in between")
            reward = _summed(agent_id, self._hanging_rewards_begin.get(agent_id, 0.0), reward)
            return _AgentStep(agent_id, "join", observation, reward=reward, info=info)
        if action is not None:  # case 3: acted, no next observation yet
            if episode is None:
                raise MultiAgentEnvError(f"agent {agent_id!r} acted before it ever observed")
            if truncated:
                raise MultiAgentEnvError(
                    f"agent {agent_id!r} acted and was truncated without a last observation (needed to bootstrap)"
                )
            if terminated:
                last, last_info = episode.get_observations(-1), episode.get_infos(-1)
                return _AgentStep(agent_id, "step", last, action, reward, last_info, outputs, **flags)
            return _AgentStep(agent_id, "hang", action=action, reward=reward, outputs=outputs or {})
        # case 4: only a reward and/or done flags
        if terminated or truncated:
            if hanging is None:  # never acted: not part of this episode
                return _AgentStep(agent_id, "forget")
            assert episode is not None  # it acted, so it observed (case 3)
            if truncated:
                raise MultiAgentEnvError(
                    f"agent {agent_id!r} acted and was truncated without a last observation (needed to bootstrap)"
                )
            last, last_info = episode.get_observations(-1), episode.get_infos(-1)
            outputs = self._hanging_extra_model_outputs_end.get(agent_id)
            reward = _summed(agent_id, self._hanging_rewards_end.get(agent_id, 0.0), reward)
            return _AgentStep(agent_id, "step", last, hanging, reward, last_info, outputs, settles=True, **flags)
        if episode is None:
            reward = _summed(agent_id, self._hanging_rewards_begin.get(agent_id, 0.0), reward)
            return _AgentStep(agent_id, "reward_begin", reward=reward)
        return _AgentStep(
            agent_id, "reward_end", reward=_summed(agent_id, self._hanging_rewards_end.get(agent_id, 0.0), reward)
        )

    def _record_env_step(
        self, observations: dict[AgentID, Any], terminated: bool, truncated: bool, agent_steps: list[_AgentStep]
    ) -> None:
        """Record a checked env step (`CheckedEnvStep.record`)."""
        self.env_t += 1
        self.is_terminated, self.is_truncated = terminated, truncated
        for agent_id, mapping in self.env_t_to_agent_t.items():
            if agent_id not in observations:
                mapping.append(self.SKIP_ENV_TS_TAG)
        for step in agent_steps:
            self._record_agent_step(step)
        self._last_step_time = time.perf_counter()
        if self._start_time is None:
            self._start_time = self._last_step_time

    def _record_agent_step(self, step: _AgentStep) -> None:
        """Record one agent's checked part of an env step (`_check_agent_step`)."""
        agent_id = step.agent_id
        if step.kind == "step":
            if step.settles:  # the hanging action it completes
                for cache in (
                    self._hanging_actions_end,
                    self._hanging_extra_model_outputs_end,
                    self._hanging_rewards_end,
                ):
                    cache.pop(agent_id, None)
            episode = self.agent_episodes[agent_id]
            episode.add_env_step(
                step.observation,
                step.action,
                step.reward,
                step.info,
                terminated=step.terminated,
                truncated=step.truncated,
                extra_model_outputs=step.outputs or None,
            )
            self.env_t_to_agent_t[agent_id].append(episode.t)
            if step.terminated or step.truncated:
                self._del_hanging(agent_id)
        elif step.kind == "forget":
            self._del_hanging(agent_id)
        elif step.kind == "join":
            self._join(agent_id, step.observation, step.info)
            self._hanging_rewards_begin[agent_id] = step.reward
        elif step.kind == "hang":
            self._hanging_actions_end[agent_id] = step.action
            self._hanging_rewards_end[agent_id] = step.reward
            assert step.outputs is not None  # a "hang" step always carries its outputs (a dict)
            self._hanging_extra_model_outputs_end[agent_id] = step.outputs
        elif step.kind == "reward_begin":
            self._hanging_rewards_begin[agent_id] = step.reward
        else:  # "reward_end"
            self._hanging_rewards_end[agent_id] = step.reward

    def _join(self, agent_id: AgentID, observation: Any, info: dict | None) -> None:
        """An agent's first observation, mid-episode: skip tags for every env step before this one."""
        episode = self._new_agent_episode(agent_id)
        episode.add_env_reset(observation, info)
        self.env_t_to_agent_t[agent_id] = self._skipped_until_now([0])
        self.agent_episodes[agent_id] = episode

    def _skipped_until_now(self, tail: list) -> InfiniteLookbackBuffer:
        """The env-step mapping of an agent new to this chunk: skip tags for every env step before `tail`, the
        lookback's included (the other agents' env-step lookback, as in RLlib), so that an index there finds
        the agent absent rather than out of range."""
        lookback = min((mapping.lookback for mapping in self.env_t_to_agent_t.values()), default=0)
        skipped = [self.SKIP_ENV_TS_TAG] * (lookback + self.env_t - self.env_t_started)
        return InfiniteLookbackBuffer(skipped + list(tail), lookback=lookback)

    def _new_agent_episode(self, agent_id: AgentID) -> SingleAgentEpisode:
        return SingleAgentEpisode(
            agent_id=agent_id,
            module_id=self.module_for(agent_id),
            multi_agent_episode_id=self.id_,
            observation_space=_sub_space(self.observation_space, agent_id),
            action_space=_sub_space(self.action_space, agent_id),
        )

    def validate(self) -> None:
        """Validate every agent's episode (see `SingleAgentEpisode.validate`)."""
        for episode in self.agent_episodes.values():
            episode.validate()

    def to_numpy(self) -> MultiAgentEpisode:
        """Convert every agent's episode to numpy storage (`SingleAgentEpisode.to_numpy`). Returns self."""
        for episode in self.agent_episodes.values():
            episode.to_numpy()
        return self

    # --- chunks ---------------------------------------------------------------------------------------

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """Start the successor chunk (length 0, same id, `env_t_started = self.env_t`).

        Every agent that is not done continues with its episode's `cut()` successor (same id, `chunk_index
        + 1`): with up to `len_lookback_buffer` of its steps as lookback, or all steps taken within the last
        `len_lookback_buffer` env steps, whichever are fewer; at least its last observation. Hanging
        actions, outputs and rewards move into the successor, so pending steps complete there; as in RLlib,
        `len_lookback_buffer` grows to reach back to the last observation of every agent whose action hangs.
        """
        if self.is_done:
            raise RuntimeError(f"episode {self.id_} is done: it has no successor")
        if len_lookback_buffer < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {len_lookback_buffer}")
        # As RLlib: the env-step lookback reaches back to the last observation of every agent whose action hangs,
        # so the successor can look up the observation its pending step starts from.
        len_lookback_buffer = max(
            [len_lookback_buffer] + [self._env_steps_since_observed(a) for a in self._hanging_actions_end]
        )
        successor = MultiAgentEpisode(
            self.id_,
            observation_space=self.observation_space,
            action_space=self.action_space,
            env_t_started=self.env_t,
            agent_module_ids=self._agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        for agent_id, episode in self.agent_episodes.items():
            if episode.is_done:
                continue
            mapping = self.env_t_to_agent_t[agent_id]
            recent = mapping.get(slice(-len_lookback_buffer - 1, None)) if len_lookback_buffer else [mapping.get(-1)]
            agent_steps_in_window = sum(t != self.SKIP_ENV_TS_TAG for t in recent) - 1
            lookback = min(len_lookback_buffer, max(agent_steps_in_window, 0))
            sa = episode.cut(len_lookback_buffer=lookback)
            successor.agent_episodes[agent_id] = sa
            successor.agent_t_started[agent_id] = sa.t_started
            successor.env_t_to_agent_t[agent_id] = InfiniteLookbackBuffer(list(recent), lookback=len(recent) - 1)
            if agent_id in self._hanging_actions_end:
                successor._hanging_actions_end[agent_id] = copy.deepcopy(self._hanging_actions_end[agent_id])
                successor._hanging_extra_model_outputs_end[agent_id] = copy.deepcopy(
                    self._hanging_extra_model_outputs_end[agent_id]
                )
            if agent_id in self._hanging_rewards_end:
                successor._hanging_rewards_end[agent_id] = self._hanging_rewards_end[agent_id]
        successor._hanging_rewards_begin.update(
            {a: r for a, r in self._hanging_rewards_begin.items() if a not in self.agent_episodes}
        )
        successor.custom_data = copy.deepcopy(self.custom_data)
        return successor

    def _env_steps_since_observed(self, agent_id: AgentID) -> int:
        """Env steps since the agent's last observation (0: it observed at the latest one)."""
        mapping = self.env_t_to_agent_t[agent_id].data
        return next(i for i, t in enumerate(reversed(mapping)) if t != self.SKIP_ENV_TS_TAG)

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Append `other` (the chunk that continues this one: same id, `other.env_t_started == self.env_t`)."""
        if other.id_ != self.id_:
            raise ValueError(f"cannot concat episode {other.id_} to episode {self.id_}")
        if self.is_done:
            raise RuntimeError(f"episode {self.id_} is done: nothing can follow it")
        if self.env_t != other.env_t_started:
            raise ValueError(f"chunk starts at env_t={other.env_t_started}, this episode ends at env_t={self.env_t}")
        # Rewards before an agent's first observation, as the uncut episode holds them: `other` carries on those of
        # agents that had not observed by this chunk's end (summed further, or cleared when the agent left without
        # observing); an agent done in `other` has none left (as `add_env_step` clears them when it is done).
        observed = set(self.agent_episodes)
        done = {a for a, e in other.agent_episodes.items() if e.is_done}
        self._hanging_rewards_begin = defaultdict(
            float,
            {a: r for a, r in self._hanging_rewards_begin.items() if a in observed and a not in done}
            | {a: r for a, r in other._hanging_rewards_begin.items() if a not in observed},
        )
        for agent_id, theirs in other.agent_episodes.items():
            mine = self.agent_episodes.get(agent_id)
            tail = other.env_t_to_agent_t[agent_id].get()
            if mine is None:
                self.agent_episodes[agent_id] = theirs
                self.agent_t_started[agent_id] = theirs.t_started
                if theirs.module_id is not None:
                    self._agent_to_module_mapping.setdefault(agent_id, theirs.module_id)
                self.env_t_to_agent_t[agent_id] = self._skipped_until_now(tail)
            elif mine.is_done:
                continue
            else:
                mine.concat_episode(theirs)
                self.env_t_to_agent_t[agent_id].extend(list(tail[1:]))
            for cache in ("_hanging_actions_end", "_hanging_extra_model_outputs_end", "_hanging_rewards_end"):
                mine_cache, their_cache = getattr(self, cache), getattr(other, cache)
                mine_cache.pop(agent_id, None)
                if agent_id in their_cache:
                    mine_cache[agent_id] = copy.deepcopy(their_cache[agent_id])
        # Agents absent from `other` skipped its steps (done ones too: the uncut episode maps every env step of each)
        for agent_id, mapping in self.env_t_to_agent_t.items():
            if agent_id not in other.agent_episodes:
                mapping.extend([self.SKIP_ENV_TS_TAG] * (other.env_t - other.env_t_started))
        self.env_t = other.env_t
        if other.is_terminated:
            self.is_terminated = True
        elif other.is_truncated:
            self.is_truncated = True
        self.custom_data.update(other.custom_data)

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> MultiAgentEpisode:
        """A new episode with env steps `slice_` of this one (step 1; indices exclude the lookback).

        Each agent keeps its steps whose observations fall within the slice's env steps `a..b`; as in RLlib, an
        action taken before env step b whose next observation comes after it (or has not come yet) hangs, with
        its reward and outputs, while the action after an observation at b itself belongs to the next env step
        and is left out; `len_lookback_buffer` (default:
        the agents' current lookback) applies to each agent's steps. Done flags are kept only for agents
        whose episode ends inside the slice.
        """
        if slice_.step not in (None, 1):
            raise NotImplementedError(f"episode slices need step 1, got {slice_.step}")
        n = len(self)
        start, stop, _ = slice_.indices(n)
        sliced = MultiAgentEpisode(
            self.id_,
            observation_space=self.observation_space,
            action_space=self.action_space,
            env_t_started=self.env_t_started + start,
            agent_module_ids=self._agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        sliced.env_t = self.env_t_started + stop
        for agent_id, episode in self.agent_episodes.items():
            window = self.env_t_to_agent_t[agent_id].get(slice(start, stop + 1), fill=self.SKIP_ENV_TS_TAG)
            steps = [t for t in window if t != self.SKIP_ENV_TS_TAG]
            if not steps:
                continue
            first, last = steps[0] - episode.t_started, steps[-1] - episode.t_started
            sa = episode.slice(slice(first, last), len_lookback_buffer=len_lookback_buffer)
            keep_done = last == len(episode)
            sa.is_terminated, sa.is_truncated = episode.is_terminated and keep_done, episode.is_truncated and keep_done
            sliced.agent_episodes[agent_id] = sa
            sliced.agent_t_started[agent_id] = sa.t_started
            sliced.env_t_to_agent_t[agent_id] = InfiniteLookbackBuffer(list(window))
            # The action after the slice's last observation hangs if it was taken inside the slice: an observation at
            # env step `stop` itself is followed by the action of the step after the slice.
            if sa.is_done or window[-1] != self.SKIP_ENV_TS_TAG:
                continue
            if last < len(episode):  # completed later in this episode
                sliced._hanging_actions_end[agent_id] = episode.get_actions(last)
                sliced._hanging_rewards_end[agent_id] = float(episode.get_rewards(last))
                sliced._hanging_extra_model_outputs_end[agent_id] = {
                    k: episode.get_extra_model_outputs(k, last) for k in episode.extra_model_outputs
                }
            elif agent_id in self._hanging_actions_end:  # still hanging here
                sliced._hanging_actions_end[agent_id] = copy.deepcopy(self._hanging_actions_end[agent_id])
                sliced._hanging_rewards_end[agent_id] = self._hanging_rewards_end[agent_id]
                sliced._hanging_extra_model_outputs_end[agent_id] = copy.deepcopy(
                    self._hanging_extra_model_outputs_end[agent_id]
                )
        ends = stop == n
        sliced.is_terminated, sliced.is_truncated = self.is_terminated and ends, self.is_truncated and ends
        return sliced

    def __getitem__(self, item: builtins.slice) -> MultiAgentEpisode:
        """`episode[a:b]` is `episode.slice(slice(a, b))`; only slices are supported."""
        if not isinstance(item, slice):
            raise NotImplementedError(f"MultiAgentEpisode supports only slices (episode[a:b]), got {item!r}")
        return self.slice(item)

    # --- agents ---------------------------------------------------------------------------------------

    @property
    def agent_ids(self) -> set[AgentID]:
        return set(self.agent_episodes)

    @property
    def agent_episode_ids(self) -> dict[AgentID, str]:
        return {agent_id: episode.id_ for agent_id, episode in self.agent_episodes.items()}

    def module_for(self, agent_id: AgentID) -> ModuleID:
        """The agent's module (mapped once, when first asked, by `agent_to_module_mapping_fn`)."""
        if agent_id not in self._agent_to_module_mapping:
            self._agent_to_module_mapping[agent_id] = self.agent_to_module_mapping_fn(agent_id, self)
        return self._agent_to_module_mapping[agent_id]

    def get_agents_to_act(self) -> set[AgentID]:
        """Agents that observed at the latest env step and are not done: the next actions are theirs."""
        return {a for a in self.get_agents_that_stepped() if not self.agent_episodes[a].is_done}

    def get_agents_that_stepped(self) -> set[AgentID]:
        """Agents that observed at the latest env step (including ones whose episode just ended)."""
        return {a for a, m in self.env_t_to_agent_t.items() if m.get(-1) != self.SKIP_ENV_TS_TAG}

    def get_terminateds(self) -> dict[AgentID, bool]:
        return {**{a: e.is_terminated for a, e in self.agent_episodes.items()}, ALL: self.is_terminated}

    def get_truncateds(self) -> dict[AgentID, bool]:
        return {**{a: e.is_truncated for a, e in self.agent_episodes.items()}, ALL: self.is_truncated}

    # --- getters and setters --------------------------------------------------------------------------

    def get_observations(
        self,
        indices: Indices = None,
        agent_ids: Collection[AgentID] | AgentID | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        """Observations at `indices` (env steps, or agent steps with `env_steps=False`), per agent."""
        return self._get(
            "observations",
            None,
            indices,
            agent_ids,
            env_steps,
            neg_index_as_lookback,
            fill,
            one_hot_discrete,
            return_list,
        )

    def get_infos(
        self,
        indices: Indices = None,
        agent_ids: Collection[AgentID] | AgentID | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        """Info dicts at `indices`, per agent."""
        return self._get("infos", None, indices, agent_ids, env_steps, neg_index_as_lookback, fill, False, return_list)

    def get_actions(
        self,
        indices: Indices = None,
        agent_ids: Collection[AgentID] | AgentID | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        """Actions at `indices` (the action taken after the observation at that index), hanging ones included."""
        return self._get(
            "actions", None, indices, agent_ids, env_steps, neg_index_as_lookback, fill, one_hot_discrete, return_list
        )

    def get_rewards(
        self,
        indices: Indices = None,
        agent_ids: Collection[AgentID] | AgentID | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: float | None = None,
        return_list: bool = False,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        """Rewards at `indices` (each agent step's reward sits at the env step of its action)."""
        return self._get(
            "rewards", None, indices, agent_ids, env_steps, neg_index_as_lookback, fill, False, return_list
        )

    def get_extra_model_outputs(
        self,
        key: str | None = None,
        indices: Indices = None,
        agent_ids: Collection[AgentID] | AgentID | None = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        """Extra model output `key` (None: a dict of all keys) at `indices`, like the actions."""
        return self._get(
            "extra_model_outputs", key, indices, agent_ids, env_steps, neg_index_as_lookback, fill, False, return_list
        )

    def set_observations(self, *, new_data: dict, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite agents' observations in place (agent-step indices; see `SingleAgentEpisode.set_observations`)."""
        for agent_id, data in new_data.items():
            self._agent(agent_id).set_observations(
                new_data=data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_actions(self, *, new_data: dict, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite agents' actions in place (agent-step indices)."""
        for agent_id, data in new_data.items():
            self._agent(agent_id).set_actions(
                new_data=data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_rewards(self, *, new_data: dict, at_indices: Indices = None, neg_index_as_lookback: bool = False):
        """Overwrite agents' rewards in place (agent-step indices)."""
        for agent_id, data in new_data.items():
            self._agent(agent_id).set_rewards(
                new_data=data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_extra_model_outputs(
        self, *, key: str, new_data: dict, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite agents' extra model output `key` in place (agent-step indices)."""
        for agent_id, data in new_data.items():
            self._agent(agent_id).set_extra_model_outputs(
                key=key, new_data=data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def _agent(self, agent_id: AgentID) -> SingleAgentEpisode:
        if agent_id not in self.agent_episodes:
            raise KeyError(f"agent {agent_id!r} is not in episode {self.id_}")
        return self.agent_episodes[agent_id]

    def _get(
        self,
        what: str,
        key: str | None,
        indices: Indices,
        agent_ids: Collection[AgentID] | AgentID | None,
        env_steps: bool,
        neg_index_as_lookback: bool,
        fill: Any,
        one_hot_discrete: bool,
        return_list: bool,
    ) -> dict[AgentID, Any] | list[dict[AgentID, Any]]:
        if return_list and not env_steps:
            raise ValueError(f"get_{what}() takes return_list=True only with env_steps=True")
        if agent_ids is None:
            wanted = set(self.agent_episodes)
        elif isinstance(agent_ids, str) or not isinstance(agent_ids, Collection):
            wanted = {agent_ids}
        else:
            wanted = set(agent_ids)
        options = {"one_hot_discrete": True} if one_hot_discrete else {}
        per_agent: dict[AgentID, Any] = {}
        rows: dict[AgentID, list] = {}
        for agent_id, _episode in self.agent_episodes.items():
            if agent_id not in wanted:
                continue
            buffer = self._buffer(what, key, agent_id)
            if buffer is None:
                continue
            if not env_steps:
                value = buffer.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill, **options)
                if not (isinstance(value, list) and not value):
                    per_agent[agent_id] = value
                continue
            pad = fill is not None or return_list  # lists have one dict per index, empty where out of range
            positions = self._positions(what, agent_id, buffer, indices, neg_index_as_lookback, pad)
            if isinstance(positions, list):
                items = [self._item(buffer, p, fill, options) for p in positions]
                rows[agent_id] = items
                kept = [item for item in items if item is not _SKIP]
                if kept:
                    per_agent[agent_id] = batch(kept) if buffer.finalized else kept
            else:
                item = self._item(buffer, positions, fill, options)
                if item is not _SKIP:
                    per_agent[agent_id] = item
        if not return_list:
            return per_agent
        if isinstance(indices, int):
            return [per_agent]
        if not rows:
            return []
        length = len(next(iter(rows.values())))
        return [{a: items[i] for a, items in rows.items() if items[i] is not _SKIP} for i in range(length)]

    def _buffer(self, what: str, key: str | None, agent_id: AgentID) -> InfiniteLookbackBuffer | _DictBuffer | None:
        """The agent's buffer of `what`, with its hanging value appended (actions, rewards, outputs)."""
        episode = self.agent_episodes[agent_id]
        if what == "extra_model_outputs":
            outputs = episode.extra_model_outputs
            hanging = self._hanging_extra_model_outputs_end.get(agent_id)
            if key is None:
                keys = list(outputs) or list(hanging or {})
                if not keys:
                    return None
                buffers = {k: self._buffer(what, k, agent_id) for k in keys}
                return _DictBuffer(buffers)
            buffer = outputs[key] if key in outputs else InfiniteLookbackBuffer()
            return _with_last(buffer, None if agent_id not in self._hanging_actions_end else (hanging or {}).get(key))
        buffer = getattr(episode, what)
        if what == "actions" and agent_id in self._hanging_actions_end:
            return _with_last(buffer, self._hanging_actions_end[agent_id])
        if what == "rewards" and agent_id in self._hanging_actions_end:
            return _with_last(buffer, self._hanging_rewards_end.get(agent_id, 0.0))
        return buffer

    def _positions(
        self, what: str, agent_id: AgentID, buffer: Any, indices: Indices, neg_index_as_lookback: bool, pad: bool
    ) -> Any:
        """Env-step `indices` as positions in the agent's buffer (lookback included), or SKIP_ENV_TS_TAG."""
        mapping = self.env_t_to_agent_t[agent_id]
        if what not in ("observations", "infos"):  # no action yet after the latest observation
            mapping = InfiniteLookbackBuffer(mapping.data[:-1], lookback=mapping.lookback)
        if indices is None:
            indices = slice(0, None)
        skip = self.SKIP_ENV_TS_TAG if pad else None  # out of range without padding: IndexError
        agent_ts = mapping.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=skip)
        offset = self.agent_episodes[agent_id].t_started - buffer.lookback
        length = buffer.len_incl_lookback()

        def position(t: Any) -> Any:
            if t == self.SKIP_ENV_TS_TAG:
                return t
            p = t - offset
            return p if 0 <= p < length else self.SKIP_ENV_TS_TAG

        return [position(t) for t in agent_ts] if isinstance(agent_ts, list) else position(agent_ts)

    def _item(self, buffer: Any, position: Any, fill: Any, options: dict) -> Any:
        if position == self.SKIP_ENV_TS_TAG:
            if fill is None:
                return _SKIP
            return buffer.get(buffer.len_incl_lookback() + 10**9, fill=fill, **options)
        return buffer.get(position - buffer.lookback, neg_index_as_lookback=True, **options)

    # --- summaries ------------------------------------------------------------------------------------

    @property
    def is_reset(self) -> bool:
        return any(episode.is_reset for episode in self.agent_episodes.values())

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def is_numpy(self) -> bool:
        """True once every agent's episode is in numpy storage (RuntimeError when only some are)."""
        flags = {episode.is_numpy for episode in self.agent_episodes.values()}
        if len(flags) > 1:
            raise RuntimeError(f"only some agent episodes of {self!r} are in numpy storage")
        return flags.pop() if flags else False

    def __len__(self) -> int:
        """Env steps in this episode (chunk)."""
        return self.env_t - self.env_t_started

    def env_steps(self) -> int:
        return len(self)

    def agent_steps(self) -> int:
        """Agent steps in this chunk: the sum of the agents' episode lengths."""
        return sum(len(episode) for episode in self.agent_episodes.values())

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        """Sum of all agents' returns (plus the rewards not yet in any agent step, if asked)."""
        total = sum(episode.get_return() for episode in self.agent_episodes.values())
        if include_hanging_rewards:
            total += sum(self._hanging_rewards_begin.values()) + sum(self._hanging_rewards_end.values())
        return total

    def get_duration_s(self) -> float:
        if self._last_step_time is None or self._start_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def __repr__(self) -> str:
        returns = {a: e.get_return() for a, e in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"

    # --- state ----------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The episode as a plain dict (RLlib's keys; agent episodes as their states); see `from_state`."""
        return {
            "id_": self.id_,
            "agent_to_module_mapping_fn": self.agent_to_module_mapping_fn,
            "_agent_to_module_mapping": dict(self._agent_to_module_mapping),
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "env_t_started": self.env_t_started,
            "env_t": self.env_t,
            "agent_t_started": dict(self.agent_t_started),
            "env_t_to_agent_t": {a: m.get_state() for a, m in self.env_t_to_agent_t.items()},
            "_hanging_actions_end": dict(self._hanging_actions_end),
            "_hanging_extra_model_outputs_end": dict(self._hanging_extra_model_outputs_end),
            "_hanging_rewards_end": dict(self._hanging_rewards_end),
            "_hanging_rewards_begin": dict(self._hanging_rewards_begin),
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "agent_episodes": list({a: e.get_state() for a, e in self.agent_episodes.items()}.items()),
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": self.custom_data,
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> MultiAgentEpisode:
        """Rebuild an episode from `get_state()`'s dict."""
        episode = MultiAgentEpisode(
            state["id_"],
            observation_space=state["observation_space"],
            action_space=state["action_space"],
            env_t_started=state["env_t_started"],
            agent_module_ids=state["_agent_to_module_mapping"],
            agent_to_module_mapping_fn=state["agent_to_module_mapping_fn"],
        )
        episode.env_t = state["env_t"]
        episode.agent_t_started.update(state["agent_t_started"])
        episode.env_t_to_agent_t = {
            a: InfiniteLookbackBuffer.from_state(m) for a, m in state["env_t_to_agent_t"].items()
        }
        episode._hanging_actions_end = dict(state["_hanging_actions_end"])
        episode._hanging_extra_model_outputs_end.update(state["_hanging_extra_model_outputs_end"])
        episode._hanging_rewards_end.update(state["_hanging_rewards_end"])
        episode._hanging_rewards_begin.update(state["_hanging_rewards_begin"])
        episode.is_terminated, episode.is_truncated = state["is_terminated"], state["is_truncated"]
        episode.agent_episodes = {a: SingleAgentEpisode.from_state(s) for a, s in state["agent_episodes"]}
        episode._start_time, episode._last_step_time = state["_start_time"], state["_last_step_time"]
        episode.custom_data = state.get("custom_data", {})
        episode.validate()
        return episode

    def _del_hanging(self, agent_id: AgentID) -> None:
        for cache in (
            self._hanging_rewards_begin,
            self._hanging_actions_end,
            self._hanging_extra_model_outputs_end,
            self._hanging_rewards_end,
        ):
            cache.pop(agent_id, None)


@dataclass(frozen=True)
class _AgentStep:
    """What recording one agent's part of an env step does: "step" (a step of its episode; `settles`: completing
    its hanging action), "join" (its first observation), "hang" (an action waiting for its next observation),
    "reward_begin" / "reward_end" (its summed rewards before its first observation / since its last action),
    "forget" (it leaves having never acted)."""

    agent_id: AgentID
    kind: str
    observation: Any = None
    action: Any = None
    reward: float = 0.0
    info: dict | None = None
    outputs: dict | None = None
    terminated: bool = False
    truncated: bool = False
    settles: bool = False


class CheckedEnvStep:
    """An env step that `MultiAgentEpisode.check_env_step` found within the rules, not recorded yet."""

    def __init__(
        self,
        episode: MultiAgentEpisode,
        observations: dict[AgentID, Any],
        *,
        terminated: bool,
        truncated: bool,
        agent_steps: list[_AgentStep],
    ) -> None:
        self._episode = episode
        self._observations = observations
        self._agent_steps = agent_steps
        self.terminated, self.truncated = terminated, truncated  # the episode's, once recorded
        # The agents that act next once it is recorded (what `get_agents_to_act()` will say then).
        self.agents_to_act = (
            {s.agent_id for s in agent_steps if s.kind in ("step", "join") and not (s.terminated or s.truncated)}
            if not (terminated or truncated)
            else set()
        )

    def record(self) -> None:
        """Record it in its episode (as `add_env_step` would have)."""
        self._episode._record_env_step(self._observations, self.terminated, self.truncated, self._agent_steps)


class _Skip:
    """Marks an env step at which an agent has no data (and no fill was asked for)."""


_SKIP = _Skip()


class _DictBuffer:
    """Several buffers read as one: each item is a dict of the buffers' items (all extra model outputs)."""

    def __init__(self, buffers: dict[str, Any]) -> None:  # each an InfiniteLookbackBuffer
        self.buffers = buffers
        first = next(iter(buffers.values()))
        self.lookback, self.finalized = first.lookback, first.finalized

    def len_incl_lookback(self) -> int:
        return next(iter(self.buffers.values())).len_incl_lookback()

    def get(self, indices: Indices = None, **kwargs: Any) -> Any:
        return {key: buffer.get(indices, **kwargs) for key, buffer in self.buffers.items()}


def _summed(agent_id: AgentID, total: float, reward: float) -> float:
    """An agent's rewards between two of its steps, summed; refused where float32, the dtype its episode stores
    rewards in, cannot hold the sum (two rewards of 3e38 each would train on inf)."""
    summed = total + reward
    if not finite_as_float32(summed):
        raise RewardSumNotFinite(
            f"agent {agent_id!r}: its rewards since its last step sum to {summed:g}, not finite as float32"
        )
    return summed


def _with_last(buffer: InfiniteLookbackBuffer, value: Any) -> InfiniteLookbackBuffer:
    """A copy of `buffer` with `value` appended (the buffer itself when value is None)."""
    if value is None:
        return buffer
    data = list(buffer.data) if not buffer.finalized else map_structure(np.copy, buffer.data)
    extended = InfiniteLookbackBuffer(data, lookback=buffer.lookback, space=buffer.space)
    extended.append(value)
    return extended


def _sub_space(space: gym.spaces.Dict | dict | None, agent_id: AgentID) -> gym.Space | None:
    if space is None:
        return None
    return space.get(agent_id) if isinstance(space, dict) else space.spaces.get(agent_id)
