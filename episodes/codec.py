"""SingleAgentEpisode <-> rlgate.v1.Episode: columnar, one tensor (or nested value) per column.

Every column travels with its lookback: observations and infos have `len_lookback_buffer + len + 1`
rows, actions, rewards and extra model outputs `len_lookback_buffer + len`. Nested (Dict/Tuple) data
travels as a nested Value of tensors. The extra model output `Columns.MODEL_VERSION` travels in the
`model_versions` field (int64), the others in `extra_model_outputs`. The episode's `chunk_index` and
`multi_agent_env_steps` attributes travel in the fields of those names. Infos travel only when at least one
is non-empty (as Structs, so numbers come back as floats); `custom_data` does not travel.

Decoding builds numpy-mode buffers straight from the decoded arrays (read-only views of the message's
bytes; appending or setting copies first), with no per-step Python work except for infos.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlgate.core.codec import CodecError, fill_tensor, fill_value, from_struct, from_tensor, from_value, to_struct
from rlgate.core.columns import Columns
from rlgate.core.tree import flatten
from rlgate.episodes.infinite_lookback_buffer import InfiniteLookbackBuffer
from rlgate.episodes.single_agent_episode import SingleAgentEpisode
from rlgate.v1 import episode_pb2


def episode_to_proto(episode: SingleAgentEpisode) -> episode_pb2.Episode:
    """Encode an episode (list or numpy mode, lookback included) as an Episode message.

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
    return chunk_message(
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
    )


def chunk_message(
    episode_id: str,
    *,
    observations: Any,
    actions: Any,
    rewards: np.ndarray,
    extra_model_outputs: dict[str, Any],
    infos: list[dict],
    len_lookback_buffer: int,
    terminated: bool,
    truncated: bool,
    t_started: int,
    chunk_index: int,
    agent_id: Any = None,
    module_id: Any = None,
    multi_agent_episode_id: Any = None,
    multi_agent_env_steps: int = 0,
) -> episode_pb2.Episode:
    """An Episode message from an episode's columns as arrays (lookback included), unchecked.

    `episode_to_proto` checks an episode's columns first; the server's step table holds a chunk's columns
    consistent by construction and encodes them with this directly, without building the episode.
    """
    extra = dict(extra_model_outputs)
    versions = extra.pop(Columns.MODEL_VERSION, None)
    msg = episode_pb2.Episode(
        id=episode_id,
        chunk_index=chunk_index,
        terminated=terminated,
        truncated=truncated,
        t_started=t_started,
        len_lookback_buffer=len_lookback_buffer,
        infos=[to_struct(info) for info in infos] if any(infos) else None,
        agent_id=_text(agent_id),
        module_id=_text(module_id),
        multi_agent_episode_id=_text(multi_agent_episode_id),
        multi_agent_env_steps=multi_agent_env_steps,
    )
    # The columns are filled in place: half the cost of building each message and copying it in.
    fill_value(msg.observations, observations)
    fill_value(msg.actions, actions)
    fill_tensor(msg.rewards, rewards)
    for key, value in extra.items():
        fill_value(msg.extra_model_outputs[key], value)
    if versions is not None:
        fill_tensor(msg.model_versions, np.asarray(versions, np.int64))
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
    observations = _in_space_order(from_value(msg.observations, "observations"), observation_space)
    actions = _in_space_order(from_value(msg.actions, "actions"), action_space)
    rewards = from_tensor(msg.rewards, "rewards")
    extra = {key: from_value(value, f"extra_model_outputs[{key!r}]") for key, value in msg.extra_model_outputs.items()}
    if msg.HasField("model_versions"):
        extra[Columns.MODEL_VERSION] = from_tensor(msg.model_versions, "model_versions")

    n_rows = _rows(rewards, "rewards")
    if rewards.ndim != 1:
        raise CodecError(f"rewards: shape {rewards.shape} is not one reward per step")
    if lookback > n_rows:
        raise CodecError(f"len_lookback_buffer {lookback} > {n_rows} rows of rewards")
    n_obs = _rows(observations, "observations")
    infos = [from_struct(info) for info in msg.infos] if msg.infos else [{} for _ in range(n_obs)]
    _rows(actions, "actions")
    for key, value in extra.items():
        _rows(value, f"extra_model_outputs[{key!r}]")
    try:
        episode = SingleAgentEpisode(
            msg.id,
            observations=InfiniteLookbackBuffer(observations, lookback),
            observation_space=observation_space,
            infos=InfiniteLookbackBuffer(infos, lookback),
            actions=InfiniteLookbackBuffer(actions, lookback),
            action_space=action_space,
            rewards=InfiniteLookbackBuffer(rewards, lookback),
            extra_model_outputs={key: InfiniteLookbackBuffer(value, lookback) for key, value in extra.items()},
            terminated=msg.terminated,
            truncated=msg.truncated,
            t_started=msg.t_started,
            agent_id=msg.agent_id or None,
            module_id=msg.module_id or None,
            multi_agent_episode_id=msg.multi_agent_episode_id or None,
        )
    except ValueError as exc:
        raise CodecError(str(exc)) from exc
    episode.chunk_index = msg.chunk_index
    episode.multi_agent_env_steps = msg.multi_agent_env_steps
    return episode


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
    """The common length of the leading (time) axis of every array in `column`."""
    lengths = {leaf.shape[0] if leaf.ndim else None for leaf in flatten(column)}
    if len(lengths) != 1 or None in lengths:
        raise CodecError(f"{path}: arrays need one common leading (time) axis, got lengths {lengths}")
    return lengths.pop()


def _text(value: Any) -> str:
    return "" if value is None else str(value)
