"""PettingZoo envs (ParallelEnv or AECEnv) as the multi-agent steps rlgate.v1 carries, one per sub-env.

Each env's `reset` and `step` give what a multi-agent step message holds for it: the observations of the agents
that act next, rewards, per-agent terminated/truncated and "__all__" (RLlib's MultiAgentEnv format). An AECEnv
is stepped as RLlib's PettingZooEnv does: the acting agent's action, then the agents that are done (each
reported with its final observation and reward, then stepped with None) until the next agent that acts; each
agent's reward is the one PettingZoo accumulated for it since its last action. Sub-envs reset themselves
after their episode ends (NEXT_STEP autoreset): the next step reports the reset observations.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.agents_step import ALL, AgentsStep, is_aec


class AgentEnvs:
    """N PettingZoo envs of one kind, stepped together, each restarting itself when its episode ends."""

    def __init__(self, envs: list[Any]) -> None:
        if not envs:
            raise ValueError("AgentEnvs needs at least one env")
        self.envs = envs
        self.num_envs = len(envs)
        first = envs[0]
        self.agent_spaces: dict[str, tuple[gym.Space, gym.Space]] = {
            agent: (first.observation_space(agent), first.action_space(agent)) for agent in first.possible_agents
        }
        # Per sub-env: its episode ended at its last step (its next step is a reset), whatever "__all__" said.
        self.done = [False] * len(envs)
        self._seed: int | None = None

    def reset(self, seed: int | None = None) -> list[AgentsStep]:
        """Reset every sub-env (sub-env i seeded with seed + i)."""
        self._seed = seed
        self.done = [False] * self.num_envs
        return [self._reset(i) for i in range(self.num_envs)]

    def step(self, actions: list[dict[str, Any]]) -> list[AgentsStep]:
        """One step of every sub-env: the actions of its acting agents, or a reset where its episode had ended."""
        steps = []
        for i, (env, per_env) in enumerate(zip(self.envs, actions, strict=True)):
            if self.done[i]:
                self.done[i] = False
                steps.append(self._reset(i))
                continue
            step = self._step_aec(env, per_env) if is_aec(env) else self._step_parallel(env, per_env)
            self.done[i] = not env.agents  # see _all_flags
            steps.append(step)
        return steps

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _reset(self, i: int) -> AgentsStep:
        env = self.envs[i]
        seed = None if self._seed is None else self._seed + i
        if is_aec(env):
            env.reset(seed=seed)
            return AgentsStep({env.agent_selection: env.observe(env.agent_selection)})
        observations, _ = env.reset(seed=seed)
        return AgentsStep(dict(observations))

    @staticmethod
    def _step_parallel(env: Any, actions: dict[str, Any]) -> AgentsStep:
        observations, rewards, terminateds, truncateds, _ = env.step({a: _plain(x) for a, x in actions.items()})
        leaving = list(terminateds.keys() | truncateds.keys())
        all_terminated, all_truncated = _all_flags(not env.agents, leaving, terminateds, truncateds)
        return AgentsStep(
            dict(observations),
            {a: float(r) for a, r in rewards.items()},
            {**{a: bool(t) for a, t in terminateds.items()}, ALL: all_terminated},
            {**{a: bool(t) for a, t in truncateds.items()}, ALL: all_truncated},
        )

    @staticmethod
    def _step_aec(env: Any, actions: dict[str, Any]) -> AgentsStep:
        env.step(_plain(actions[env.agent_selection]))
        step = AgentsStep({})
        while env.agents:
            observation, reward, terminated, truncated, _ = env.last()
            agent = env.agent_selection
            step.observations[agent] = observation
            step.rewards[agent] = float(reward)
            step.terminateds[agent], step.truncateds[agent] = bool(terminated), bool(truncated)
            if not (terminated or truncated):
                break
            env.step(None)
        step.terminateds[ALL], step.truncateds[ALL] = _all_flags(
            not env.agents, list(step.observations), step.terminateds, step.truncateds
        )
        return step


def _all_flags(
    gone: bool, agents: list[str], terminateds: dict[str, bool], truncateds: dict[str, bool]
) -> tuple[bool, bool]:
    """The step's "__all__" flags (terminated, truncated) when the env's last agents are `gone`: terminated where
    every agent of the step was, truncated where every one was (or none said), and neither where they left
    differently, so that each agent ends with its own flag (a truncated one's value is bootstrapped)."""
    if not gone:
        return False, False
    terminated = [bool(terminateds.get(a, False)) for a in agents]
    truncated = [bool(truncateds.get(a, False)) for a in agents]
    if all(terminated):
        return True, False
    if any(terminated) and all(t or u for t, u in zip(terminated, truncated, strict=True)):
        return False, False
    return False, True


def _plain(action: Any) -> Any:
    """A decoded action as PettingZoo envs take it: 0-d arrays as Python numbers."""
    return action.item() if isinstance(action, np.ndarray) and action.ndim == 0 else action
