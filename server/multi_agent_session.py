"""One multi-agent client stream: a MultiAgentEpisode per sub-env, fed one step message at a time.

A step message carries, per sub-env, the observations of the agents that act next, rewards for any agent
and the done flags (see rlgate.v1's "Multi-agent sessions"). `observe` records it in the sub-env's episode
with the actions (and extra model outputs) the server answered last time, exactly as RLlib's
MultiAgentEnvRunner calls `add_env_step`; the batcher then computes actions for the agents that are to act,
and `record` keeps them until the next message. Episodes that ended, and long ones cut every
`rollout_fragment_length` env or agent steps (`count_steps_by`), ship as their agents' SingleAgentEpisode
chunks (agents with at least one step in the chunk; encoded, as `episodes.chunk.Chunk`s), the first
carrying the chunk's env steps. The chunks shipped when an episode ends carry how many agent chunks it shipped
in all (`multi_agent_episode_chunks`): the learner counts the episode's return once it has all of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym

from rlgate.core.agents_step import AgentsStep
from rlgate.core.codec import CodecError
from rlgate.core.columns import RECORDED_OUTPUTS, Columns
from rlgate.core.space_check import NonFiniteError
from rlgate.episodes import MultiAgentEpisode
from rlgate.episodes.chunk import Chunk, encoded
from rlgate.episodes.multi_agent_episode import CheckedEnvStep, MappingFn, MultiAgentEnvError, RewardSumNotFinite


@dataclass(frozen=True)
class MultiAgentSessionSpec:
    """What a multi-agent client declared in its hello."""

    client_id: str
    agent_spaces: dict[str, tuple[gym.Space, gym.Space]]
    num_envs: int
    explore: bool


class MultiAgentSession:
    """The MultiAgentEpisodes of one client stream and the actions their agents are waiting on."""

    def __init__(
        self,
        spec: MultiAgentSessionSpec,
        *,
        mapping_fn: MappingFn,
        rollout_fragment_length: int | None,
        count_steps_by: str,
        lookback: int,
        write_back: Callable[[list[MultiAgentEpisode]], None],
    ) -> None:
        """`rollout_fragment_length`: cut running episodes every this many env or agent steps; None: never.
        `write_back`: runs the env-to-module pipeline over episodes, for its pieces' observation write-backs."""
        self.id = uuid.uuid4().hex
        self.spec = spec
        self._mapping_fn = mapping_fn
        self._fragment = rollout_fragment_length
        self._agent_steps = count_steps_by == "agent_steps"
        self._lookback = lookback
        self._write_back = write_back
        self.observation_spaces = {agent: spaces[0] for agent, spaces in spec.agent_spaces.items()}
        self._episodes: list[MultiAgentEpisode | None] = [None] * spec.num_envs
        self._actions: list[dict[str, Any]] = [{} for _ in range(spec.num_envs)]
        self._outputs: list[dict[str, dict]] = [{} for _ in range(spec.num_envs)]
        self._done: list[MultiAgentEpisode] = []  # ended at the latest message, shipped by record()
        self._shipped: dict[str, int] = {}  # running episode id -> agent chunks shipped so far (cut off)
        self._parked: set[str] = set()  # episodes begun after move(): never shipped
        self.moving = False
        self._pending = False

    def move(self) -> None:
        """Hand the session over at its sub-envs' episode boundaries, as `Session.move` does."""
        self.moving = True

    def settled(self) -> bool:
        """Moving, and every recorded episode has ended."""
        return self.moving and all(e is None or e.is_done or e.id_ in self._parked for e in self._episodes)

    def observe(self, steps: list[AgentsStep]) -> tuple[list[MultiAgentEpisode], int]:
        """Record one message (a step per sub-env); returns every sub-env's episode (the batch's rows, ended
        ones included so that env-to-module pieces see their last observations) and the env or agent steps
        it completed. Raises CodecError naming the sub-env and agent when a step breaks the episode's rules,
        having recorded none of the message: every sub-env's step is checked before any is recorded."""
        if self._pending:
            raise RuntimeError("observe() twice: record() the previous step's outputs first")
        checked = [self._check(i, step) for i, step in enumerate(steps)]
        completed = 0
        episode: MultiAgentEpisode | None
        for i, (step, env_step) in enumerate(zip(steps, checked, strict=True)):
            if env_step is None:  # a reset observation starts the sub-env's next episode
                episode = self._episodes[i] = self._new_episode(i)
                if self.moving:
                    self._parked.add(episode.id_)
                episode.add_env_reset(observations=step.observations, infos=step.infos)
                continue
            episode = self._episodes[i]
            assert episode is not None  # a step that is no reset continues its sub-env's episode (_check)
            before = episode.agent_steps()
            env_step.record()
            completed += episode.agent_steps() - before if self._agent_steps else 1
            if episode.is_done:
                self._done.append(episode)
        self._actions, self._outputs = [{} for _ in steps], [{} for _ in steps]  # record() fills them in
        self._pending = True
        # The list itself, not a copy: a flush() before the batch runs swaps in the successor chunks.
        return cast("list[MultiAgentEpisode]", self._episodes), completed  # each sub-env has one now

    def _check(self, i: int, step: AgentsStep) -> CheckedEnvStep | None:
        """Sub-env i's step checked against its episode's rules (CodecError), recording nothing; None for a reset
        step (one that starts the sub-env's next episode)."""
        episode = self._episodes[i]
        if episode is None or episode.is_done:
            env_step, over, acting = None, False, set(step.observations)
        else:
            try:
                env_step = episode.check_env_step(
                    step.observations,
                    self._actions[i],
                    step.rewards,
                    step.infos,
                    terminateds=step.terminateds,
                    truncateds=step.truncateds,
                    extra_model_outputs=self._outputs[i],
                )
            except MultiAgentEnvError as exc:
                raise _step_error(i, exc) from exc
            over, acting = env_step.terminated or env_step.truncated, env_step.agents_to_act
        if not over and not acting:
            raise CodecError(f"agents[{i}]: no agent observes and the episode is not over: no one could act")
        return env_step

    def record(self, outputs: dict[str, list[dict[str, Any]]]) -> list[Chunk]:
        """Keep this step's actions and outputs (one {agent: value} dict per sub-env); the chunks now due."""
        if not self._pending:
            raise RuntimeError("record() without observe()")
        self._pending = False
        for i in range(self.spec.num_envs):
            actions = outputs[Columns.ACTIONS][i]
            self._actions[i] = dict(actions)
            self._outputs[i] = {
                agent: {key: outputs[key][i][agent] for key in RECORDED_OUTPUTS if key in outputs} for agent in actions
            }
        shipped = [chunk for episode in self._done for chunk in self._agent_chunks(episode)]
        self._done = []
        if self._fragment is not None:
            for i, episode in enumerate(self._episodes):
                if episode is not None and not episode.is_done and self._steps(episode) >= self._fragment:
                    shipped += self._cut(i)
        return shipped

    def flush(self) -> list[Chunk]:
        """Ship every step taken so far: running episodes are cut (their successors go on). While a message
        waits for its actions, its latest step ships too (episodes that ended with it included), after the
        env-to-module pipeline wrote back into it (FlattenObservations); the successors take the pending actions."""
        running = [i for i, e in enumerate(self._episodes) if e is not None and not e.is_done and len(e)]
        done, self._done = self._done, []
        if self._pending:
            self._write_back([*done, *(self._episodes[i] for i in running)])  # type: ignore[list-item]  # running ones
        return [chunk for episode in done for chunk in self._agent_chunks(episode)] + [
            chunk for i in running for chunk in self._cut(i)
        ]

    def unshipped_steps(self) -> int:
        """Env or agent steps (as the learner counts them) in running episodes, not shipped yet."""
        running = sum(
            self._steps(e) for e in self._episodes if e is not None and not e.is_done and e.id_ not in self._parked
        )
        return running + sum(self._steps(e) for e in self._done)

    def close(self) -> list[Chunk]:
        """End the session: episodes that ended and were not shipped yet, and every running one truncated (its
        agents' chunks `session_closed`: the env did not end it)."""
        shipped = [chunk for episode in self._done for chunk in self._agent_chunks(episode)]
        for episode in self._episodes:
            if episode is None or episode.is_done or episode.id_ in self._parked:
                continue
            episode.is_truncated = True
            for agent_episode in episode.agent_episodes.values():
                if not agent_episode.is_done and len(agent_episode):
                    agent_episode.is_truncated = True
                agent_episode.session_closed = True
            shipped += self._agent_chunks(episode)
        self._episodes = [None] * self.spec.num_envs
        return shipped

    def _cut(self, i: int) -> list[Chunk]:
        episode = self._episodes[i]
        assert episode is not None  # a running one
        self._episodes[i] = episode.cut(len_lookback_buffer=self._lookback)
        return self._agent_chunks(episode)

    def _agent_chunks(self, episode: MultiAgentEpisode) -> list[Chunk]:
        """The agents' episodes with at least one step in this chunk, to ship; the first carries its env steps,
        and if the episode ended, each carries how many agent chunks the episode shipped in all. None of a parked
        episode."""
        if episode.id_ in self._parked:
            return []
        chunks = [agent_episode for agent_episode in episode.agent_episodes.values() if len(agent_episode)]
        if chunks:
            chunks[0].multi_agent_env_steps = len(episode)
        shipped = self._shipped.pop(episode.id_, 0) + len(chunks)
        if episode.is_done:
            for chunk in chunks:
                chunk.multi_agent_episode_chunks = shipped
        else:
            self._shipped[episode.id_] = shipped
        return encoded(chunks)

    def _steps(self, episode: MultiAgentEpisode) -> int:
        return episode.agent_steps() if self._agent_steps else len(episode)

    def _new_episode(self, i: int) -> MultiAgentEpisode:
        return MultiAgentEpisode(
            f"{self.id}-{i}-{uuid.uuid4().hex[:8]}",
            observation_space=self.observation_spaces,
            action_space={agent: spaces[1] for agent, spaces in self.spec.agent_spaces.items()},
            agent_to_module_mapping_fn=self._mapping_fn,
        )


def _step_error(i: int, exc: MultiAgentEnvError) -> CodecError:
    """Sub-env i's step that broke its episode's rules, as the stream's error. A reward sum float32 cannot hold
    is a non-finite reward, counted as one (rlgate_non_finite_rejected_total{field="reward"})."""
    if isinstance(exc, RewardSumNotFinite):
        return NonFiniteError(f"agents[{i}]: {exc}", "reward")
    return CodecError(f"agents[{i}]: {exc}")
