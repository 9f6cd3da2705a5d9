"""Episode chunks <-> rlgate.v1: one chunk as an `Episode` message, many as an `EpisodeChunks` table.

A chunk is a `SingleAgentEpisode` (or a piece of one), or the same data as `ChunkColumns`, its columns as
arrays (what a server's step table holds). Every column travels with its lookback: observations and infos
have `len_lookback_buffer + len + 1` rows, actions, rewards and extra model outputs `len_lookback_buffer +
len`. Nested (Dict/Tuple) data travels as a nested Value of tensors. The extra model output
`Columns.MODEL_VERSION` travels in the `model_versions` field (int64), the others in `extra_model_outputs`.
The episode's `chunk_index`, `multi_agent_env_steps`, `multi_agent_episode_chunks` and `session_closed` attributes
travel in the fields of those names.
Infos travel only when at least one is non-empty (as Structs, so numbers come back as floats);
`custom_data` does not travel.

An `EpisodeChunks` table holds many chunks of the same spaces, each column every chunk's rows one after
the other: the learner decodes it a column at a time, not a message per chunk (~2x less work per chunk).

Decoding builds numpy-mode buffers straight from the decoded arrays (read-only views of the message's
bytes; appending or setting copies first), with no per-step Python work except for infos.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.codec import CodecError, fill_tensor, fill_value, from_struct, from_tensor, from_value, to_struct
from rlgate.core.columns import Columns
from rlgate.core.tree import flatten, map_structure
from rlgate.episodes.infinite_lookback_buffer import InfiniteLookbackBuffer
from rlgate.episodes.single_agent_episode import SingleAgentEpisode
from rlgate.v1 import episode_pb2


@dataclass(frozen=True)
class ChunkColumns:
    """One chunk's data as arrays, lookback included (the fields of its `Episode` message, decoded).

    `observations` (and `infos`, one dict per observation) have `len_lookback_buffer + steps + 1` rows,
    the other columns `len_lookback_buffer + steps`; `extra_model_outputs` includes MODEL_VERSION if known.
    """

    id: str
    observations: Any
    actions: Any
    rewards: np.ndarray
    extra_model_outputs: dict[str, Any]
    infos: list[dict]
    len_lookback_buffer: int
    terminated: bool
    truncated: bool
    t_started: int
    chunk_index: int
    agent_id: Any = None
    module_id: Any = None
    multi_agent_episode_id: Any = None
    multi_agent_env_steps: int = 0
    multi_agent_episode_chunks: int = 0
    session_closed: bool = False

    @property
    def steps(self) -> int:
        """Env steps after the lookback (an agent's steps, for an agent's chunk)."""
        return len(self.rewards) - self.len_lookback_buffer

    def layout(self) -> tuple:
        """What chunks must share to be one table: module, extra outputs, each leaf's row shape and dtype."""
        return (
            self.module_id,
            _leaf_layout(self.observations),
            _leaf_layout(self.actions),
            tuple((key, _leaf_layout(value)) for key, value in self.extra_model_outputs.items()),
        )


def episode_columns(episode: SingleAgentEpisode) -> ChunkColumns:
    """An episode's columns (list or numpy mode, lookback included) as arrays.

    Raises ValueError if the columns have different lookbacks or inconsistent lengths.
    """
    episode.validate()
    lookback = episode.rewards.lookback
    columns = {
        "observations": episode.observations,
        "infos": episode.infos,
        "actions": episode.actions,
        **episode.extra_model_outputs,
    }
    uneven = {name: buffer.lookback for name, buffer in columns.items() if buffer.lookback != lookback}
    if uneven:
        raise ValueError(f"episode {episode.id_}: lookbacks {uneven} differ from the rewards' {lookback}")
    return ChunkColumns(
        episode.id_,
        observations=_batched(episode.observations),
        actions=_batched(episode.actions),
        rewards=_batched(episode.rewards),
        extra_model_outputs={key: _batched(buffer) for key, buffer in episode.extra_model_outputs.items()},
        infos=episode.infos.data,
        len_lookback_buffer=lookback,
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        t_started=episode.t_started,
        chunk_index=episode.chunk_index,
        agent_id=episode.agent_id,
        module_id=episode.module_id,
        multi_agent_episode_id=episode.multi_agent_episode_id,
        multi_agent_env_steps=episode.multi_agent_env_steps,
        multi_agent_episode_chunks=episode.multi_agent_episode_chunks,
        session_closed=episode.session_closed,
    )


def episode_to_proto(episode: SingleAgentEpisode) -> episode_pb2.Episode:
    """Encode an episode (list or numpy mode, lookback included) as an Episode message (see `episode_columns`)."""
    return chunk_message(episode_columns(episode))


def chunk_message(chunk: ChunkColumns) -> episode_pb2.Episode:
    """A chunk's Episode message. Unchecked: `episode_columns` checks an episode's columns, and the server's
    step table holds a chunk's columns consistent by construction."""
    extra = dict(chunk.extra_model_outputs)
    versions = extra.pop(Columns.MODEL_VERSION, None)
    msg = episode_pb2.Episode(
        id=chunk.id,
        chunk_index=chunk.chunk_index,
        terminated=chunk.terminated,
        truncated=chunk.truncated,
        t_started=chunk.t_started,
        len_lookback_buffer=chunk.len_lookback_buffer,
        infos=[to_struct(info) for info in chunk.infos] if any(chunk.infos) else None,
        agent_id=_text(chunk.agent_id),
        module_id=_text(chunk.module_id),
        multi_agent_episode_id=_text(chunk.multi_agent_episode_id),
        multi_agent_env_steps=chunk.multi_agent_env_steps,
        multi_agent_episode_chunks=chunk.multi_agent_episode_chunks,
        session_closed=chunk.session_closed,
    )
    # The columns are filled in place: half the cost of building each message and copying it in.
    fill_value(msg.observations, chunk.observations)
    fill_value(msg.actions, chunk.actions)
    fill_tensor(msg.rewards, chunk.rewards)
    for key, value in extra.items():
        fill_value(msg.extra_model_outputs[key], value)
    if versions is not None:
        fill_tensor(msg.model_versions, np.asarray(versions, np.int64))
    return msg


def chunk_tables(chunks: Sequence[ChunkColumns]) -> list[episode_pb2.EpisodeChunks]:
    """Chunks as EpisodeChunks tables: one per `layout()` (per module, for a server), in first-seen order."""
    tables: dict[tuple, list[ChunkColumns]] = {}
    for chunk in chunks:
        tables.setdefault(chunk.layout(), []).append(chunk)
    return [_table(members) for members in tables.values()]


def _table(chunks: list[ChunkColumns]) -> episode_pb2.EpisodeChunks:
    """Chunks of one layout as a table, each column concatenated once."""
    first = chunks[0]
    msg = episode_pb2.EpisodeChunks(
        ids=[chunk.id for chunk in chunks],
        chunk_indices=[chunk.chunk_index for chunk in chunks],
        len_lookback_buffers=[chunk.len_lookback_buffer for chunk in chunks],
        steps=[chunk.steps for chunk in chunks],
        terminated=[chunk.terminated for chunk in chunks],
        truncated=[chunk.truncated for chunk in chunks],
        t_started=[chunk.t_started for chunk in chunks],
        module_id=_text(first.module_id),
    )
    if first.agent_id is not None:
        msg.agent_ids.extend(_text(chunk.agent_id) for chunk in chunks)
        msg.multi_agent_episode_ids.extend(_text(chunk.multi_agent_episode_id) for chunk in chunks)
        msg.multi_agent_env_steps.extend(chunk.multi_agent_env_steps for chunk in chunks)
        msg.multi_agent_episode_chunks.extend(chunk.multi_agent_episode_chunks for chunk in chunks)
    if any(chunk.session_closed for chunk in chunks):
        msg.session_closed.extend(chunk.session_closed for chunk in chunks)
    if any(any(chunk.infos) for chunk in chunks):
        msg.infos.extend(to_struct(info) for chunk in chunks for info in chunk.infos)
    fill_value(msg.observations, _concatenated([chunk.observations for chunk in chunks]))
    fill_value(msg.actions, _concatenated([chunk.actions for chunk in chunks]))
    fill_tensor(msg.rewards, np.concatenate([chunk.rewards for chunk in chunks]))
    for key in first.extra_model_outputs:
        column = _concatenated([chunk.extra_model_outputs[key] for chunk in chunks])
        if key == Columns.MODEL_VERSION:
            fill_tensor(msg.model_versions, np.asarray(column, np.int64))
        else:
            fill_value(msg.extra_model_outputs[key], column)
    return msg


def episode_from_proto(
    msg: episode_pb2.Episode,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
) -> SingleAgentEpisode:
    """Decode an Episode message into a numpy-mode SingleAgentEpisode with the given spaces attached.

    Checks the columns' lengths against each other (not the values against the spaces); raises
    CodecError naming the column on any mismatch. Dict data comes back in the space's key order.
    """
    lookback = msg.len_lookback_buffer
    columns = _Columns(msg, observation_space, action_space)
    n_rows = columns.rows()
    if lookback > n_rows:
        raise CodecError(f"len_lookback_buffer {lookback} > {n_rows} rows of rewards")
    n_obs = _rows(columns.observations, "observations")
    infos = [from_struct(info) for info in msg.infos] if msg.infos else [{} for _ in range(n_obs)]
    return _episode(
        ChunkColumns(
            msg.id,
            observations=columns.observations,
            actions=columns.actions,
            rewards=columns.rewards,
            extra_model_outputs=columns.extra,
            infos=infos,
            len_lookback_buffer=lookback,
            terminated=msg.terminated,
            truncated=msg.truncated,
            t_started=msg.t_started,
            chunk_index=msg.chunk_index,
            agent_id=msg.agent_id or None,
            module_id=msg.module_id or None,
            multi_agent_episode_id=msg.multi_agent_episode_id or None,
            multi_agent_env_steps=msg.multi_agent_env_steps,
            multi_agent_episode_chunks=msg.multi_agent_episode_chunks,
            session_closed=msg.session_closed,
        ),
        observation_space,
        action_space,
    )


@dataclass(frozen=True)
class ChunkTable:
    """A decoded EpisodeChunks table: each column whole (every chunk's rows one after the other, lookbacks
    included) and the chunks, whose columns are views of these. A check of the whole columns holds for every
    chunk: the learner checks a table once, and its chunks one by one only when the table fails."""

    observations: Any
    actions: Any
    rewards: np.ndarray
    extra_model_outputs: dict[str, Any]
    chunks: list[SingleAgentEpisode]


def episodes_from_chunks(
    msg: episode_pb2.EpisodeChunks,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
) -> list[SingleAgentEpisode]:
    """Decode an EpisodeChunks table into its chunks (as `episode_from_proto` each): views of its columns.

    Raises CodecError, for the whole table, when its per-chunk fields or its columns' rows do not add up.
    """
    return chunk_table(msg, observation_space, action_space).chunks if msg.ids else []


def chunk_table(
    msg: episode_pb2.EpisodeChunks,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
) -> ChunkTable:
    """Decode a table of at least one chunk: its columns and its chunks (`episodes_from_chunks`)."""
    n = len(msg.ids)
    if not n:
        raise CodecError("ids: a table holds at least one chunk")
    for name in ("chunk_indices", "len_lookback_buffers", "steps", "terminated", "truncated", "t_started"):
        if len(getattr(msg, name)) != n:
            raise CodecError(f"{name}: {len(getattr(msg, name))} entries for {n} chunks")
    for name in (
        "agent_ids",
        "multi_agent_episode_ids",
        "multi_agent_env_steps",
        "multi_agent_episode_chunks",
        "session_closed",
    ):
        if len(getattr(msg, name)) not in (0, n):
            raise CodecError(f"{name}: {len(getattr(msg, name))} entries for {n} chunks (0 or one per chunk)")
    lookbacks = list(msg.len_lookback_buffers)
    ends = np.cumsum(np.add(lookbacks, msg.steps, dtype=np.int64)).tolist()  # rewards' rows of chunk i end here
    total = ends[-1]
    columns = _Columns(msg, observation_space, action_space)
    columns.expect(total, n)
    if msg.infos and len(msg.infos) != total + n:
        raise CodecError(f"infos: {len(msg.infos)} for {total + n} observations (0 or one per observation)")
    infos = [from_struct(info) for info in msg.infos] if msg.infos else None
    indices, t_started = list(msg.chunk_indices), list(msg.t_started)
    terminated, truncated = list(msg.terminated), list(msg.truncated)
    agents, episode_ids, env_steps = msg.agent_ids, msg.multi_agent_episode_ids, msg.multi_agent_env_steps
    episode_chunks = msg.multi_agent_episode_chunks  # empty from servers that predate it
    closed = msg.session_closed  # empty unless some chunk's session closed
    module_id = msg.module_id or None
    episodes, start = [], 0
    for i, (episode_id, stop) in enumerate(zip(msg.ids, ends, strict=True)):
        rows, obs_rows = slice(start, stop), slice(start + i, stop + i + 1)  # i observations more before chunk i
        chunk = ChunkColumns(
            episode_id,
            observations=_rows_of(columns.observations, obs_rows),
            actions=_rows_of(columns.actions, rows),
            rewards=columns.rewards[rows],
            extra_model_outputs={key: _rows_of(value, rows) for key, value in columns.extra.items()},
            infos=infos[obs_rows] if infos else [{} for _ in range(stop - start + 1)],
            len_lookback_buffer=lookbacks[i],
            terminated=terminated[i],
            truncated=truncated[i],
            t_started=t_started[i],
            chunk_index=indices[i],
            agent_id=(agents[i] or None) if agents else None,
            module_id=module_id,
            multi_agent_episode_id=(episode_ids[i] or None) if episode_ids else None,
            multi_agent_env_steps=env_steps[i] if env_steps else 0,
            multi_agent_episode_chunks=episode_chunks[i] if episode_chunks else 0,
            session_closed=closed[i] if closed else False,
        )
        episodes.append(_episode(chunk, observation_space, action_space))
        start = stop
    return ChunkTable(columns.observations, columns.actions, columns.rewards, columns.extra, episodes)


class _Columns:
    """The columns of an Episode or EpisodeChunks message, decoded; `rows()` checks their lengths agree."""

    def __init__(self, msg: Any, observation_space: gym.Space | None, action_space: gym.Space | None) -> None:
        self.observations = _in_space_order(from_value(msg.observations, "observations"), observation_space)
        self.actions = _in_space_order(from_value(msg.actions, "actions"), action_space)
        self.rewards = from_tensor(msg.rewards, "rewards")
        self.extra = {
            key: from_value(value, f"extra_model_outputs[{key!r}]") for key, value in msg.extra_model_outputs.items()
        }
        if msg.HasField("model_versions"):
            self.extra[Columns.MODEL_VERSION] = from_tensor(msg.model_versions, "model_versions")

    def rows(self) -> int:
        """The rewards' rows; CodecError unless rewards are one per step and each column's leaves agree on rows."""
        if self.rewards.ndim != 1:
            raise CodecError(f"rewards: shape {self.rewards.shape} is not one reward per step")
        _rows(self.actions, "actions")
        for key, value in self.extra.items():
            _rows(value, f"extra_model_outputs[{key!r}]")
        return _rows(self.rewards, "rewards")

    def expect(self, rows: int, chunks: int) -> None:
        """CodecError unless a table of `chunks` chunks holding `rows` rows has them in every column."""
        expected = {"rewards": (self.rewards, rows), "observations": (self.observations, rows + chunks)}
        expected["actions"] = (self.actions, rows)
        expected.update({f"extra_model_outputs[{key!r}]": (value, rows) for key, value in self.extra.items()})
        self.rows()
        for path, (column, n) in expected.items():
            if _rows(column, path) != n:
                raise CodecError(f"{path}: {_rows(column, path)} rows, the chunks' lookbacks and steps make {n}")


def _episode(
    chunk: ChunkColumns, observation_space: gym.Space | None, action_space: gym.Space | None
) -> SingleAgentEpisode:
    """The chunk as a numpy-mode SingleAgentEpisode (its arrays used as they are); CodecError if they disagree."""
    lookback = chunk.len_lookback_buffer
    try:
        episode = SingleAgentEpisode(
            chunk.id,
            observations=InfiniteLookbackBuffer(chunk.observations, lookback),
            observation_space=observation_space,
            infos=InfiniteLookbackBuffer(chunk.infos, lookback),
            actions=InfiniteLookbackBuffer(chunk.actions, lookback),
            action_space=action_space,
            rewards=InfiniteLookbackBuffer(chunk.rewards, lookback),
            extra_model_outputs={
                key: InfiniteLookbackBuffer(value, lookback) for key, value in chunk.extra_model_outputs.items()
            },
            terminated=chunk.terminated,
            truncated=chunk.truncated,
            t_started=chunk.t_started,
            agent_id=chunk.agent_id,
            module_id=chunk.module_id,
            multi_agent_episode_id=chunk.multi_agent_episode_id,
        )
    except ValueError as exc:
        raise CodecError(str(exc)) from exc
    episode.chunk_index = chunk.chunk_index
    episode.multi_agent_env_steps = chunk.multi_agent_env_steps
    episode.multi_agent_episode_chunks = chunk.multi_agent_episode_chunks
    episode.session_closed = chunk.session_closed
    return episode


def _concatenated(values: list[Any]) -> Any:
    """Chunks' columns (arrays, or structs of them) joined along the time axis."""
    if isinstance(values[0], np.ndarray):
        return np.concatenate(values)
    return map_structure(lambda *leaves: np.concatenate(leaves), *values)


def _rows_of(column: Any, rows: slice) -> Any:
    """Rows of a column (an array, or a struct of them), as views."""
    if isinstance(column, np.ndarray):
        return column[rows]
    return map_structure(lambda leaf: leaf[rows], column)


def _leaf_layout(column: Any) -> tuple:
    """Each leaf's row shape and dtype (a chunk's columns are arrays: see `ChunkColumns`)."""
    if isinstance(column, np.ndarray):  # the usual column, and per shipped chunk: no flatten
        return column.shape[1:], column.dtype
    return tuple((leaf.shape[1:], leaf.dtype) for leaf in flatten(column))


def _batched(buffer: InfiniteLookbackBuffer) -> Any:
    """All of a buffer's data (lookback included) as arrays, without changing the buffer."""
    if not buffer.finalized:
        buffer = InfiniteLookbackBuffer(buffer.data, space=buffer.space)
        buffer.finalize()
    return buffer.data


def _in_space_order(data: Any, space: gym.Space | None) -> Any:
    """Dicts re-keyed in the space's key order (a protobuf map keeps none); other data unchanged."""
    if isinstance(data, np.ndarray):  # the common case, before the spaces' (slow) ABC isinstance checks
        return data
    if isinstance(space, gym.spaces.Dict) and isinstance(data, dict):
        order = {key: i for i, key in enumerate(space.spaces)}
        keys = sorted(data, key=lambda key: order.get(key, len(order)))
        return {key: _in_space_order(data[key], space.spaces.get(key)) for key in keys}
    if isinstance(space, gym.spaces.Tuple) and isinstance(data, tuple) and len(data) == len(space.spaces):
        return tuple(_in_space_order(item, sub) for item, sub in zip(data, space.spaces, strict=True))
    return data


def _rows(column: Any, path: str) -> int:
    """The common length of the leading (time) axis of every array in `column` (which holds no empty dict or
    tuple: no space makes one, and an episode's buffers find their length in the first array)."""
    if _holds_empty(column):
        raise CodecError(f"{path}: an empty dict or tuple, which holds no rows")
    lengths = {leaf.shape[0] if leaf.ndim else None for leaf in flatten(column)}
    if len(lengths) != 1 or None in lengths:
        raise CodecError(f"{path}: arrays need one common leading (time) axis, got lengths {lengths}")
    (length,) = lengths
    assert length is not None  # refused just above
    return length


def _holds_empty(column: Any) -> bool:
    if isinstance(column, np.ndarray):
        return False
    items = list(column.values()) if isinstance(column, dict) else list(column)
    return not items or any(map(_holds_empty, items))


def _text(value: Any) -> str:
    return "" if value is None else str(value)
