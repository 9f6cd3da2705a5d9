"""Evaluating a policy: whole episodes in a local env, their returns and lengths, optionally recorded as video."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlgate.envs.agent_envs import AgentEnvs
from rlgate.policy.multi_agent_policy import MultiAgentPolicy
from rlgate.policy.policy import Policy
from rlgate.spec.env import env_factory
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.run import EnvSpec


@dataclass
class Evaluation:
    """The return and length of every evaluated episode, in order."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    # Multi-agent: each agent's return in every episode (`returns` sums them, as RLlib's episode return does).
    agent_returns: dict[str, list[float]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Episodes, and the mean, std (population), min and max of the returns and lengths; multi-agent, also
        each agent's mean return."""
        out: dict[str, Any] = {"episodes": len(self.returns)}
        for name, values in (("return", self.returns), ("length", self.lengths)):
            out[f"{name}_mean"] = statistics.fmean(values) if values else None
            out[f"{name}_std"] = statistics.pstdev(values) if values else None
            out[f"{name}_min"] = min(values, default=None)
            out[f"{name}_max"] = max(values, default=None)
        if self.agent_returns:
            out["agent_return_mean"] = {a: statistics.fmean(v) if v else None for a, v in self.agent_returns.items()}
        return out


def evaluate(
    policy: Policy, env: gym.Env, episodes: int, *, explore: bool = False, seed: int | None = None
) -> Evaluation:
    """Run `episodes` whole episodes of `env` (one after another) with the policy's actions; episode i is
    reset with `seed + i` when a seed is given. The env should end its episodes (e.g. a TimeLimit)."""
    result = Evaluation()
    for i in range(episodes):
        observation, _ = env.reset(seed=None if seed is None else seed + i)
        episode = policy.new_episode()
        reward, total, length, done = 0.0, 0.0, 0, False
        while not done:
            action = policy.compute_action(observation, episode, reward=reward, explore=explore)
            observation, step_reward, terminated, truncated, _ = env.step(action)
            reward = float(step_reward)
            total += reward
            length += 1
            done = terminated or truncated
        result.returns.append(total)
        result.lengths.append(length)
    return result


def evaluate_multi_agent(
    policy: MultiAgentPolicy, env: Any, episodes: int, *, explore: bool = False, seed: int | None = None
) -> Evaluation:
    """Run `episodes` whole episodes of a PettingZoo env (ParallelEnv or AECEnv, stepped as the env clients
    step it: `spec.agent_envs`) with the policy's actions; episode i is reset with `seed + i` when a seed is
    given. A length counts env steps (an AECEnv's: turns); `agent_returns` has every possible agent's."""
    envs = AgentEnvs([env])
    result = Evaluation(agent_returns={agent: [] for agent in envs.agent_spaces})
    for i in range(episodes):
        step = envs.reset(seed=None if seed is None else seed + i)[0]
        episode = policy.new_episode()
        returns, length = dict.fromkeys(envs.agent_spaces, 0.0), 0
        while not envs.done[0]:
            actions = policy.compute_actions(
                step.observations,
                episode,
                rewards=step.rewards,
                terminateds=step.terminateds,
                truncateds=step.truncateds,
                explore=explore,
            )
            step = envs.step([actions])[0]
            length += 1
            for agent, reward in step.rewards.items():
                returns[agent] = returns.get(agent, 0.0) + reward
        result.returns.append(sum(returns.values()))
        result.lengths.append(length)
        for agent, value in returns.items():
            result.agent_returns.setdefault(agent, []).append(value)
    return result


def make_eval_env(spec: EnvSpec, imports: ImportPolicy, video_dir: Path | None = None) -> gym.Env:
    """One env of `spec`; with `video_dir`, rendered (render_mode="rgb_array") and every episode recorded
    there as mp4 by gymnasium's RecordVideo, which needs moviepy (`pip install 'rlgate[video]'`)."""
    if video_dir is None:
        return env_factory(spec, imports)()
    try:
        import moviepy  # noqa: F401  (RecordVideo's writer)
    except ImportError:
        raise SpecError("--video needs moviepy: pip install 'rlgate[video]'") from None
    rendered = spec.model_copy(update={"kwargs": {**spec.kwargs, "render_mode": "rgb_array"}})
    try:
        env = env_factory(rendered, imports)()
    except TypeError as exc:
        raise SpecError(f"env {spec.id} cannot render for --video (render_mode='rgb_array'): {exc}") from exc
    try:
        return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True, name_prefix="eval")
    except (ValueError, gym.error.Error) as exc:
        env.close()
        raise SpecError(f"env {spec.id} cannot be recorded for --video: {exc}") from exc
