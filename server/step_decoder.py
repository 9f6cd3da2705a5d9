"""StepDecoder: one session's step messages, decoded and checked against what its hello declared.

Built once at hello (the spaces prepared as `SpaceCheck`s for the session's number of sub-envs), so a
step costs what its message holds: per column one dtype, shape and length comparison and one value test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from google.protobuf import struct_pb2

from rlgate.core import codec
from rlgate.core.codec import CodecError
from rlgate.core.space_check import FlagsCheck, NonFiniteError, SpaceCheck
from rlgate.v1 import policy_pb2 as pb

# Rewards: finite floats (any float dtype on the wire), stored as float32.
REWARD_SPACE = gym.spaces.Box(-np.inf, np.inf, (), np.float32)
# Most bytes of infos one step message may hold (all its sub-envs' and agents'): infos are converted, stored and
# shipped value by value, microseconds each, on the event loop; 6 MB of them held every other client for 2.4 s.
MAX_INFOS_BYTES = 1 << 18
# Said when observations hold +-inf and the server does not allow them.
_INFINITE_HINT = " (+-inf passes only where the Box bound is infinite, on a server started with --allow-non-finite-obs)"


class StepDecoder:
    """Decodes a session's `Step` messages: [num_envs] rows of observations, rewards and done flags."""

    def __init__(self, observation_space: gym.Space, num_envs: int, *, allow_non_finite_obs: bool = False) -> None:
        self.num_envs = num_envs
        self._obs = SpaceCheck(observation_space, path="obs", allow_infinite=allow_non_finite_obs)
        self._reward = SpaceCheck(REWARD_SPACE, path="reward")
        self._terminated = FlagsCheck("terminated")
        self._truncated = FlagsCheck("truncated")
        self._no_rewards = np.zeros(num_envs, np.float32)
        self._no_flags = np.zeros(num_envs, np.bool_)

    def decode(
        self, step: pb.Step, resets_only: Callable[[], bool]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict] | None]:
        """(obs, rewards, terminateds, truncateds, infos); CodecError (NonFiniteError) on any mismatch.

        reward, terminated and truncated may be left out only when `resets_only()`: every row carries a
        reset observation, so nothing reads them (the first step after hello).
        """
        n = self.num_envs
        if not step.HasField("obs"):
            raise CodecError("obs: missing")
        try:
            obs = self._obs.decode(step.obs, n)
        except NonFiniteError as exc:
            if "not finite" in str(exc):
                raise _with_hint(exc) from None
            raise
        if step.HasField("reward") and step.HasField("terminated") and step.HasField("truncated"):
            rewards = self._reward.decode_tensor(step.reward, n)
            terminateds = self._terminated.decode_tensor(step.terminated, n)
            truncateds = self._truncated.decode_tensor(step.truncated, n)
        else:
            rewards, terminateds, truncateds = self._optional_columns(step, resets_only)
        infos = step.infos
        if infos:
            if len(infos) != n:
                raise CodecError(f"infos: {len(infos)} items != {n}")
            check_infos_size(infos, "infos")
        return obs, rewards, terminateds, truncateds, [codec.from_struct(s) for s in infos] if infos else None

    def _optional_columns(
        self, step: pb.Step, resets_only: Callable[[], bool]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """reward, terminated and truncated when some are left out: zeros for those, if nothing reads them."""
        n = self.num_envs
        columns = []
        for name, check, absent in (
            ("reward", self._reward, self._no_rewards),
            ("terminated", self._terminated, self._no_flags),
            ("truncated", self._truncated, self._no_flags),
        ):
            if step.HasField(name):  # type: ignore[arg-type]  # name: one of the literal field names above
                columns.append(check.decode_tensor(getattr(step, name), n))
            elif resets_only():
                columns.append(absent)
            else:
                raise CodecError(
                    f"{name}: missing; every step carries reward, terminated and truncated ({n} each), except one "
                    "in which every sub-env sends a reset observation"
                )
        return columns[0], columns[1], columns[2]


def check_infos_size(infos: Iterable[struct_pb2.Struct], path: str) -> None:
    """CodecError when a step's infos hold more than MAX_INFOS_BYTES (their wire size: C code measures it)."""
    size = sum(info.ByteSize() for info in infos)
    if size > MAX_INFOS_BYTES:
        raise CodecError(
            f"{path}: {size} bytes in one step > {MAX_INFOS_BYTES}: infos are stored with every step of the episodes; "
            "keep them small (what the policy needs belongs in the observation)"
        )


def _with_hint(exc: NonFiniteError) -> NonFiniteError:
    return NonFiniteError(str(exc) + _INFINITE_HINT, exc.field)
