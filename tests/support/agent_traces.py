"""Scripted multi-agent env traces: agents join mid-episode, leave early, get rewards between their actions.

`trace(seed)` is a deterministic list of ("reset", observations) and ("step", observations, actions,
rewards, terminateds, truncateds) records, as a MultiAgentEnv would emit them to an env runner (actions are
those of the agents that observed in the previous record). `replay` feeds one to a MultiAgentEpisode;
`summary` reads back what tests compare: the getters over many index forms, per agent.
tests/episodes/data/make_rllib_reference.py ran the same functions with RLlib 2.60's MultiAgentEpisode
to write the reference file the tests compare against.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

INDEX_FORMS: list[Any] = [None, -1, 0, 1, -2, slice(0, 3), slice(-3, None), [0, 2, -1]]


def trace(seed: int, n_agents: int = 3, steps: int = 12, turn_based: bool = False) -> list[tuple]:
    """One episode of a scripted env with `n_agents` agents and at most `steps` env steps. `turn_based`: of the
    agents whose actions hang, only the one that acted first may observe in a step (agents joining besides)."""
    rng = random.Random(seed)
    acted_at: dict[str, int] = {}
    agents = [f"a{i}" for i in range(n_agents)]
    first = set(rng.sample(agents, rng.randint(1, n_agents)))
    joined, gone, hanging = set(first), set(), set()
    records: list[tuple] = [("reset", {a: float(rng.randint(0, 9)) for a in sorted(first)})]
    to_act = set(first)
    for t in range(steps):
        actions = {a: rng.randint(0, 3) for a in sorted(to_act)}
        hanging |= set(actions)
        acted_at |= dict.fromkeys(actions, t)
        turn = min(hanging, key=lambda a: (acted_at[a], a)) if turn_based and hanging else None
        obs, rewards, terminateds = {}, {}, {}
        last = t == steps - 1
        veterans = joined - gone  # RLlib ends the episode once all agents that were in it before this step are done
        for a in agents:
            if a in gone:
                continue
            if a not in joined:
                if not last and rng.random() < 0.3:  # joins mid-episode
                    joined.add(a)
                    obs[a] = float(rng.randint(0, 9))
                elif rng.random() < 0.3:
                    rewards[a] = 0.25  # a reward before its first observation: not part of its episode
                continue
            if a in hanging and a == (turn or a) and (rng.random() < 0.6 or (last and rng.random() < 0.5)):
                obs[a] = float(rng.randint(0, 9))
                hanging.discard(a)
                rewards[a] = round(rng.random(), 2)
                if not last and rng.random() < 0.15 and len(veterans - gone) > 1:  # leaves early
                    terminateds[a] = True
                    gone.add(a)
            elif rng.random() < 0.5:
                rewards[a] = round(rng.random(), 2)  # a reward between two of its actions
        to_act = {a for a in obs if not terminateds.get(a)}
        ends = last or not (to_act or hanging) or joined <= gone
        records.append(("step", obs, actions, rewards, {**terminateds, "__all__": ends}, {"__all__": False}))
        if ends:
            break
    return records


def replay(episode: Any, records: list[tuple]) -> Any:
    """Feed `records` to `episode` (extra model output "logp" = action / 10); returns the episode."""
    for record in records:
        if record[0] == "reset":
            episode.add_env_reset(observations=record[1])
            continue
        _, obs, actions, rewards, terminateds, truncateds = record
        outputs = {a: {"logp": v / 10} for a, v in actions.items()}
        episode.add_env_step(
            obs, actions, rewards, terminateds=terminateds, truncateds=truncateds, extra_model_outputs=outputs
        )
    return episode


def plain(x: Any) -> Any:
    """`x` as JSON-able builtins, floats rounded (RLlib keeps numpy rewards in float32, rlgate in float64)."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return plain(x.tolist())
    if isinstance(x, np.generic):
        return plain(x.item())
    if isinstance(x, float):
        return round(x, 5)
    return x


def summary(episode: Any) -> dict[str, Any]:
    """What an episode answers to the getters (every index form, with and without fill, env and agent steps)."""
    out: dict[str, Any] = {
        "len": len(episode),
        "agent_steps": episode.agent_steps(),
        "return": episode.get_return(),
        "return_hanging": episode.get_return(include_hanging_rewards=True),
        "terminateds": episode.get_terminateds(),
        "to_act": sorted(episode.get_agents_to_act()),
        "stepped": sorted(episode.get_agents_that_stepped()),
        "env_t_to_agent_t": {a: list(m.data) for a, m in episode.env_t_to_agent_t.items()},
        "logp[-1]": episode.get_extra_model_outputs("logp", -1),
        "logp": episode.get_extra_model_outputs("logp"),
    }
    for agent_id, sa in episode.agent_episodes.items():
        out[f"agent {agent_id}"] = [
            sa.get_observations(),
            sa.get_actions(),
            sa.get_rewards(),
            sa.is_terminated,
            sa.t_started,
            sa.t,
        ]
    for what in ("observations", "actions", "rewards"):
        get = getattr(episode, f"get_{what}")
        for index in INDEX_FORMS:
            for fill in (None, -1.0):
                out[f"{what}[{index}] fill={fill}"] = _answer(get, index, fill=fill)
        for index in (slice(0, 4), slice(-2, None)):
            out[f"{what}[{index}] return_list"] = _answer(get, index, return_list=True)
        for index in (-1, 0, slice(0, 2)):
            out[f"{what}[{index}] env_steps=False"] = _answer(get, index, env_steps=False)
    return plain(out)


def _answer(get: Any, index: Any, **kwargs: Any) -> Any:
    try:
        return get(index, **kwargs)
    except IndexError:
        return "IndexError"


def per_agent(records: list[tuple]) -> dict[str, list]:
    """Each agent's observations, actions and rewards in one episode's records, as RLlib's MultiAgentEpisode
    keeps them: each reward summed into the agent's next step, rewards before its first observation left out,
    and an agent whose action still hangs when the episode ends repeating its last observation."""
    obs: dict[str, list] = {a: [o] for a, o in records[0][1].items()}
    actions: dict[str, list] = {a: [] for a in obs}
    rewards: dict[str, list] = {a: [] for a in obs}
    pending: dict[str, float] = {}
    for _, observations, acted, step_rewards, terminateds, _ in records[1:]:
        for a in acted:
            actions[a].append(acted[a])
            pending[a] = 0.0
        for a, r in step_rewards.items():
            if a in pending:
                pending[a] += r
        for a, o in observations.items():
            if a not in obs:
                obs[a], actions[a], rewards[a] = [o], [], []
            elif a in pending:
                obs[a].append(o)
                rewards[a].append(pending.pop(a))
        if terminateds["__all__"]:
            for a, r in pending.items():  # terminated with a hanging action: the last observation repeats
                obs[a].append(obs[a][-1])
                rewards[a].append(r)
    return {a: [obs[a], actions[a], list(np.round(rewards[a], 6))] for a in obs}


class JoinLeaveEnv:
    """A PettingZoo ParallelEnv that plays `trace`'s script live: agents join mid-episode, leave early, observe
    only some steps after acting, get rewards between their actions and before they join. Actions come from
    outside (a policy); the env keeps, per episode, the records of what it emitted and received (`records`),
    and fails when an action comes for an agent that was not asked to act. Observations are Box(1,) counters."""

    metadata: dict[str, Any] = {}

    def __init__(self, seed: int, n_agents: int = 3, steps: int = 12) -> None:
        import gymnasium as gym

        self.possible_agents = [f"a{i}" for i in range(n_agents)]
        self.records: list[list[tuple]] = []
        self._rng = random.Random(seed)
        self._steps = steps
        self._observation_space = gym.spaces.Box(0.0, 1e6, (1,), np.float32)
        self._action_space = gym.spaces.Discrete(4)
        self._counter = 0.0
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> Any:
        return self._observation_space

    def action_space(self, agent: str) -> Any:
        return self._action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        rng = self._rng
        first = set(rng.sample(self.possible_agents, rng.randint(1, len(self.possible_agents))))
        self._joined, self._gone, self._hanging, self._t = set(first), set(), set(), 0
        observations = {a: self._observe() for a in sorted(first)}
        self._to_act = set(first)
        self.agents = sorted(first)
        self.records.append([("reset", _values(observations))])
        return observations, {a: {} for a in observations}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if set(actions) != self._to_act:
            raise AssertionError(f"actions for {sorted(actions)}, but {sorted(self._to_act)} were asked to act")
        rng, agents = self._rng, self.possible_agents
        actions = {a: int(x) for a, x in actions.items()}
        self._hanging |= set(actions)
        observations, rewards, terminateds = {}, {}, {}
        last = self._t == self._steps - 1
        veterans = self._joined - self._gone
        for a in agents:
            if a in self._gone:
                continue
            if a not in self._joined:
                if not last and rng.random() < 0.3:  # joins mid-episode
                    self._joined.add(a)
                    observations[a] = self._observe()
                elif rng.random() < 0.3:
                    rewards[a] = 0.25  # a reward before its first observation: not part of its episode
                continue
            if a in self._hanging and (rng.random() < 0.6 or (last and rng.random() < 0.5)):
                observations[a] = self._observe()
                self._hanging.discard(a)
                rewards[a] = round(rng.random(), 2)
                if not last and rng.random() < 0.15 and len(veterans - self._gone) > 1:  # leaves early
                    terminateds[a] = True
                    self._gone.add(a)
            elif rng.random() < 0.5:
                rewards[a] = round(rng.random(), 2)  # a reward between two of its actions
        self._to_act = {a for a in observations if not terminateds.get(a)}
        ends = last or not self._to_act or self._joined <= self._gone  # rlgate.v1: someone acts while it goes on
        self._t += 1
        self.agents = [] if ends else sorted(self._joined - self._gone)
        if ends:  # every agent still in the episode is done with it
            terminateds.update({a: True for a in self._joined - self._gone})
        record = ("step", _values(observations), actions, rewards, {**terminateds, "__all__": ends}, {"__all__": False})
        self.records[-1].append(record)
        return observations, rewards, terminateds, {a: False for a in terminateds}, {a: {} for a in observations}

    def close(self) -> None:
        pass

    def _observe(self) -> np.ndarray:
        self._counter += 1.0
        return np.array([self._counter], np.float32)


def _values(observations: dict[str, np.ndarray]) -> dict[str, float]:
    return {a: float(o[0]) for a, o in observations.items()}
