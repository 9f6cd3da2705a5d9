"""`MultiAgentPolicy`: a multi-agent run's trained policy in plain Python, from a checkpoint or a running learner.

`Policy`'s counterpart for runs with `[multi_agent]`: the checkpoint's own multi-agent pipelines, its modules
(one per module id, each agent acting with the module the run spec maps it to) and its agent-to-module mapping,
exactly as a server serves them. A `MultiAgentPolicyEpisode` (one per env and episode) is the
`MultiAgentEpisode` the pieces read earlier steps from; the env's step goes in as RLlib's MultiAgentEnv returns
it (observations of the agents that act next, rewards, per-agent done flags)::

    policy = MultiAgentPolicy.load("runs/multi_agent_cartpole-20250101-120000/checkpoints")
    observations, _ = env.reset(seed=0)                  # a PettingZoo ParallelEnv
    episode = policy.new_episode()
    actions = policy.compute_actions(observations, episode)
    observations, rewards, terminateds, truncateds, _ = env.step(actions)
    actions = policy.compute_actions(observations, episode, rewards=rewards, terminateds=terminateds,
                                     truncateds=truncateds)

`rlgate.evaluate_multi_agent` plays whole episodes of a PettingZoo env (parallel or AEC) this way.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlgate.core.agents_step import ALL, AgentsStep
from rlgate.core.columns import Columns
from rlgate.episodes import MultiAgentEpisode
from rlgate.episodes.multi_agent_episode import MappingFn
from rlgate.policy.acting import ActingCore
from rlgate.policy.policy import KEEP_STEPS, RECORDED
from rlgate.policy.trained import TrainedPolicy
from rlgate.spec.imports import ImportPolicy, SpecError
from rlgate.spec.multi_agent import AgentSpaces, agent_spaces_of, spaces_by_agent
from rlgate.spec.run import RunSpec


class MultiAgentPolicyEpisode:
    """One env's running multi-agent episode as the policy sees it: each agent's past observations, actions,
    rewards and model outputs, for the pieces and modules that read them. Start a new one when the env resets."""

    def __init__(self, agent_spaces: AgentSpaces, mapping_fn: MappingFn, lookback: int) -> None:
        self.episode = MultiAgentEpisode(
            f"policy-{uuid.uuid4().hex}",
            observation_space={agent: spaces[0] for agent, spaces in agent_spaces.items()},
            action_space={agent: spaces[1] for agent, spaces in agent_spaces.items()},
            agent_to_module_mapping_fn=mapping_fn,
        )
        # By agent that acted last: its actions, action_dist_inputs, state_out, ... (one step's, unbatched)
        self.last_outputs: dict[str, dict[str, Any]] = {}
        self._lookback = lookback

    def observe(self, step: AgentsStep) -> None:
        """The env's step (the first one: its reset observations), with the actions the policy gave last."""
        episode = self.episode
        if not episode.is_reset:
            episode.add_env_reset(observations=step.observations, infos=step.infos)
            return
        episode.add_env_step(
            step.observations,
            {agent: outputs[Columns.ACTIONS] for agent, outputs in self.last_outputs.items()},
            step.rewards,
            step.infos,
            terminateds=step.terminateds,
            truncateds=step.truncateds,
            extra_model_outputs={
                agent: {key: outputs[key] for key in RECORDED if key in outputs}
                for agent, outputs in self.last_outputs.items()
            },
        )
        self.last_outputs = {}
        if len(episode) >= KEEP_STEPS and not episode.is_done:
            self.episode = episode.cut(len_lookback_buffer=self._lookback)


class MultiAgentPolicy(TrainedPolicy):
    """A multi-agent run's pipelines and modules, acting for one env's agents (see the module docstring)."""

    def __init__(
        self,
        spec: RunSpec,
        agent_spaces: AgentSpaces,
        *,
        module_weights: dict[str, bytes] | None = None,
        connector_state: dict[str, Any] | None = None,
        version: int = 0,
        imports: ImportPolicy | None = None,
        device: str = "cpu",
        seed: int | None = None,
    ) -> None:
        """The spec's policy for these agents' spaces (with `module_weights` and `connector_state`, else fresh).
        `imports`: where code the spec names may come from (default: rlgate's own only); `seed` seeds torch's
        generator, which samples the actions of explore=True."""
        if spec.multi_agent is None:
            raise SpecError("a single-agent run (no [multi_agent]): use rlgate.Policy")
        self._act_with(
            ActingCore.build(
                spec,
                *spaces_by_agent(agent_spaces),
                imports,
                weights=module_weights,
                connector_state=connector_state,
                version=version,
                device=device,
                seed=seed,
            )
        )
        self.agent_spaces = self.core.agent_spaces
        assert self.core.mapping_fn is not None  # a multi-agent core's
        self.mapping_fn = self.core.mapping_fn

    @classmethod
    def from_parts(
        cls,
        spec: RunSpec,
        observation_space: gym.Space,
        action_space: gym.Space,
        weights: bytes | dict[str, bytes],
        **kwargs: Any,
    ) -> MultiAgentPolicy:
        """`MultiAgentPolicy(...)` from what a checkpoint or a learner holds (see `TrainedPolicy`): spaces are Dicts by
        agent id, weights one set per module."""
        if not isinstance(weights, dict):
            raise SpecError("a single-agent run's weights: use rlgate.Policy")
        return cls(spec, agent_spaces_of(observation_space, action_space), module_weights=weights, **kwargs)

    def new_episode(self) -> MultiAgentPolicyEpisode:
        """A fresh episode: make one per env, and a new one whenever that env resets."""
        return MultiAgentPolicyEpisode(self.agent_spaces, self.mapping_fn, self._lookback)

    def compute_actions(
        self,
        observations: Mapping[str, Any],
        episode: MultiAgentPolicyEpisode | None = None,
        *,
        rewards: Mapping[str, float] | None = None,
        terminateds: Mapping[str, bool] | None = None,
        truncateds: Mapping[str, bool] | None = None,
        explore: bool = False,
    ) -> dict[str, Any]:
        """The actions {agent id: action} of the agents in `observations` (those that act next), each in its
        agent's action space. `episode`: the env's running episode (None: a fresh one, this its reset step);
        `rewards`, `terminateds`, `truncateds`: what the env's step returned with the observations (ignored on
        the reset step; the done flags may hold "__all__"). An episode that the flags end gets no actions.
        `explore`: sample from each agent's action distribution instead of taking its most likely action."""
        episode = episode if episode is not None else self.new_episode()
        step = AgentsStep(
            dict(observations),
            {agent: float(reward) for agent, reward in (rewards or {}).items()},
            {ALL: False, **(terminateds or {})},
            {ALL: False, **(truncateds or {})},
        )
        episode.observe(step)
        if episode.episode.is_done:
            return {}
        to_env = self.core.act([episode.episode], explore)
        episode.last_outputs = {
            agent: {column: values[0][agent] for column, values in to_env.items() if agent in values[0]}
            for agent in to_env[Columns.ACTIONS][0]
        }
        return dict(to_env[Columns.ACTIONS_FOR_ENV][0])
