"""A server's `EpisodeBatch`, decoded at the learner's edge: its chunks as episodes, each checked against the run.

The learner's service decodes every batch it receives here, and the intake takes only what this module hands it
(`DecodedBatch`): episodes in the run's spaces, each already checked for what could poison training
(`chunk_check`), and refusals with their reason. What decoding needs is the run's spaces and model outputs, fixed
for a learner's life (`BatchDecoder`); what depends on what came before (duplicates, the steps of a split chunk
trained before a restart) is the intake's. The batch's bytes travel with it: the intake writes them to disk
before it acknowledges, and decodes its files at start-up through the same decoder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlgate.core import codec
from rlgate.episodes import SingleAgentEpisode
from rlgate.episodes.chunk_codec import ChunkTable, chunk_table, episode_from_proto
from rlgate.learner.chunk_check import episode_misfit, misfit
from rlgate.v1 import learner_pb2


def chunk_key(episode_id: str, chunk_index: int) -> str:
    """A chunk's identity across resends: its episode and its place in it."""
    return f"{episode_id}:{chunk_index}"


@dataclass(frozen=True)
class Decoded:
    """One entry of a batch, in order: a chunk that fits (`episode`), or a refusal of `chunks` chunks for `reason`
    (`what` says which, for the log). `key` names a single chunk (a refused one too: a resent chunk counts as a
    duplicate whatever it holds); a refusal of a whole table or batch has none."""

    key: str | None
    episode: SingleAgentEpisode | None = None
    reason: str = ""
    what: str = ""
    chunks: int = 1
    error: BaseException | None = None  # the exception behind an "unreadable batch", for the log's traceback


@dataclass(frozen=True)
class DecodedBatch:
    """A server's batch as the intake takes it: its entries, the connector statistics it carries (decoded; None
    when it carries none, or when they do not decode: `connector_state_error` says why), and its bytes."""

    server_id: str
    seq: int
    entries: list[Decoded]
    connector_state: Any = None
    connector_state_error: str = ""
    payload: bytes = b""  # the batch as received, written to disk before it is acknowledged


@dataclass(frozen=True)
class BatchDecoder:
    """Decodes batches in a run's spaces and checks their chunks against its model.

    `observation_spaces`: the spaces a batch may say its observations are in (the env's and each env-to-module
    piece's output); the first is assumed when a batch says none. Multi-agent: `module_spaces` gives each module's
    (observation space, action space), in which the chunks of its agents (`agents`: the ids a chunk may name)
    are decoded. `output_shapes`: each module's model output shapes (chunk_check.output_shapes), a single-agent
    run's under None. Observations must be finite unless `allow_nonfinite_obs` (the env's spec allows +-inf).
    """

    observation_spaces: list[gym.Space]
    action_space: gym.Space
    module_spaces: Mapping[str, tuple[gym.Space, gym.Space]] | None = None
    agents: frozenset[str] = frozenset()
    output_shapes: Mapping[str | None, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    allow_nonfinite_obs: bool = False

    def decode(self, batch: learner_pb2.EpisodeBatch, payload: bytes | None = None) -> DecodedBatch:
        """`batch` decoded (`payload`: its bytes, if the caller has them). Never raises: a batch whose decoding
        raises anything unforeseen (a bug, or a user's space failing on an odd batch) is one refusal,
        "unreadable batch", of all its chunks."""
        try:
            entries = list(self._entries(batch))
        except Exception as exc:
            what = f"all of the batch from server {batch.server_id}: {exc!r}"
            entries = [Decoded(None, reason="unreadable batch", what=what, chunks=_chunks(batch), error=exc)]
        state, error = None, ""
        if batch.HasField("connector_state"):
            try:
                state = codec.from_value(batch.connector_state, "connector_state")
            except ValueError as exc:
                error = f"connector state from server {batch.server_id}: {exc}"
        raw = batch.SerializeToString() if payload is None else payload
        return DecodedBatch(batch.server_id, batch.seq, entries, state, error, raw)

    def _entries(self, batch: learner_pb2.EpisodeBatch) -> Iterator[Decoded]:
        server = batch.server_id
        try:  # multi-agent chunks are decoded in their module's spaces instead
            observation_space = self._observation_space(batch) if self.module_spaces is None else None
        except ValueError as exc:
            what = f"all of the batch from server {server}: {exc}"
            yield Decoded(None, reason="unknown observation space", what=what, chunks=_chunks(batch))
            return
        for message in batch.episodes:  # one message per chunk (servers before EpisodeChunks, spooled)
            key = chunk_key(message.id, message.chunk_index)
            what = f"{key} from server {server}"
            spaces, refusal = self._spaces(observation_space, message.module_id, message.agent_id)
            if spaces is None:
                yield Decoded(key, reason=refusal[0], what=f"{what}: {refusal[1]}")
                continue
            try:
                episode = episode_from_proto(message, *spaces)
            except ValueError as exc:  # CodecError included: one bad chunk never blocks the others
                yield Decoded(key, reason="malformed", what=f"{what}: {exc}")
                continue
            yield self._checked(key, episode, server)
        for table in batch.chunks:
            if not table.ids:  # an empty table: nothing in it
                continue
            what = f"a table of {len(table.ids)} chunks from server {server}"
            spaces, refusal = self._spaces(observation_space, table.module_id, None)
            if spaces is None:
                yield Decoded(None, reason=refusal[0], what=f"{what}: {refusal[1]}", chunks=len(table.ids))
                continue
            try:
                decoded = chunk_table(table, *spaces)
            except ValueError as exc:  # the table's rows do not add up: none of its chunks can be told apart
                yield Decoded(None, reason="malformed", what=f"{what}: {exc}", chunks=len(table.ids))
                continue
            # One check of the whole table; only a table that fails is checked chunk by chunk, to find which.
            fits = self._misfit_table(decoded, spaces, table.module_id or None) is None
            for episode in decoded.chunks:
                key = chunk_key(episode.id_, episode.chunk_index)
                if self.module_spaces is not None and episode.agent_id not in self.agents:
                    agent = f"{key} from server {server}: agent {episode.agent_id!r}"
                    yield Decoded(key, reason="unknown agent", what=agent)
                    continue
                yield Decoded(key, episode) if fits else self._checked(key, episode, server)

    def _checked(self, key: str, episode: SingleAgentEpisode, server: str) -> Decoded:
        """A decoded chunk, or its refusal if it holds what could poison training."""
        reason = episode_misfit(
            episode,
            self.output_shapes.get(episode.module_id, {}),
            finite_observations=not self.allow_nonfinite_obs,
        )
        if reason is not None:
            return Decoded(key, reason=reason, what=f"{key} from server {server}: {reason}")
        return Decoded(key, episode)

    def _misfit_table(
        self, table: ChunkTable, spaces: tuple[gym.Space | None, gym.Space], module_id: str | None
    ) -> str | None:
        return misfit(
            table.observations,
            table.actions,
            table.rewards,
            table.extra_model_outputs,
            spaces,
            self.output_shapes.get(module_id, {}),
            finite_observations=not self.allow_nonfinite_obs,
        )

    def _spaces(
        self, observation_space: gym.Space | None, module_id: str, agent_id: str | None
    ) -> tuple[tuple[gym.Space | None, gym.Space] | None, tuple[str, str]]:
        """The spaces to decode chunks in, or None and (reason, why) refused: single-agent, the batch's observation
        space and the action space (and no module named: the chunks are held to the run's module's outputs);
        multi-agent, their module's (and the agent, if given, must be known)."""
        if self.module_spaces is None:
            if module_id:
                return None, ("unknown module", f"module {module_id!r} in a single-agent run")
            return (observation_space, self.action_space), ("", "")
        if agent_id is not None and agent_id not in self.agents:
            return None, ("unknown agent", f"agent {agent_id!r}")
        if module_id not in self.module_spaces:
            return None, ("unknown module", f"module {module_id!r}")
        return self.module_spaces[module_id], ("", "")

    def _observation_space(self, batch: learner_pb2.EpisodeBatch) -> gym.Space:
        """The space the batch's observations are in: what it says, if that is one of the known spaces."""
        if not batch.HasField("observation_space"):
            return self.observation_spaces[0]
        space = codec.space_from_proto(batch.observation_space, "observation_space")
        if space not in self.observation_spaces:
            raise ValueError(f"observation_space {space} is neither the env's nor an env-to-module piece's")
        return space


def _chunks(batch: learner_pb2.EpisodeBatch) -> int:
    """The chunks a batch holds, in messages and tables."""
    return len(batch.episodes) + sum(len(table.ids) for table in batch.chunks)
