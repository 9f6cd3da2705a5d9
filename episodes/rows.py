"""EpisodeRows: the episodes of a batch's rows when they are stored column-wise, not as episode objects.

The inference server keeps each client's sub-env episodes as columns ([steps, sub-envs, ...] arrays,
one write per column per message) and builds `SingleAgentEpisode`s only when they ship. Connector
pipelines still take `episodes`: an `EpisodeRows` is that sequence. Row i is a real
`SingleAgentEpisode`, built from the columns the first time a per-episode piece asks for it (the
default pieces on the batched fast path never do), and the observation write-back of transforming
pieces (`set_latest_observations`) is one batched write instead of B per-episode ones.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, overload

import gymnasium as gym

from rlgate.core.tree import map_structure
from rlgate.episodes.single_agent_episode import SingleAgentEpisode


class RowSource(Protocol):
    """A block of consecutive rows (e.g. one client's sub-envs at its current step)."""

    def __len__(self) -> int: ...

    def episode(self, i: int) -> SingleAgentEpisode:
        """Row i's episode up to and including its latest observation."""
        ...

    def set_latest_observations(self, observations: Any, observation_space: gym.Space | None) -> None:
        """Replace the latest observation of every row ([rows, ...]) and the episodes' observation space."""
        ...


class EpisodeRows(Sequence[SingleAgentEpisode]):
    """The episodes of one batch, row by row, over one or more blocks of rows (in order)."""

    def __init__(self, blocks: Sequence[RowSource]) -> None:
        self.blocks = list(blocks)
        self._starts: list[int] = []
        total = 0
        for block in self.blocks:
            self._starts.append(total)
            total += len(block)
        self._len = total

    @classmethod
    def concat(cls, parts: Sequence[EpisodeRows]) -> EpisodeRows:
        """One batch's rows from several requests' rows, in order."""
        return cls([block for part in parts for block in part.blocks])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> SingleAgentEpisode: ...

    @overload
    def __getitem__(self, index: slice) -> list[SingleAgentEpisode]: ...

    def __getitem__(self, index: int | slice) -> SingleAgentEpisode | list[SingleAgentEpisode]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"row {index} out of range for {self._len} rows")
        b = bisect_right(self._starts, index) - 1
        return self.blocks[b].episode(index - self._starts[b])

    def __iter__(self) -> Iterator[SingleAgentEpisode]:
        for block in self.blocks:
            for i in range(len(block)):
                yield block.episode(i)

    def set_latest_observations(self, observations: Any, observation_space: gym.Space | None) -> None:
        """Write transformed observations ([B, ...], row i for row i's episode) block by block."""
        for block, start in zip(self.blocks, self._starts, strict=True):
            stop = start + len(block)
            block.set_latest_observations(
                map_structure(lambda x, a=start, b=stop: x[a:b], observations), observation_space
            )
