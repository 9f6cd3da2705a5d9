"""Cutting episodes into zero-padded sequences of `max_seq_len` steps (stateful modules), and back."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlgate.core.tree import map_structure


def num_sequences(episode_len: int, max_seq_len: int) -> int:
    """How many sequences of `max_seq_len` steps an episode of `episode_len` steps fills."""
    return math.ceil(episode_len / max_seq_len)


def create_mask_and_seq_lens(episode_len: int, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The [n, max_seq_len] validity mask (False on padding) and the [n] lengths of an episode's sequences."""
    n = num_sequences(episode_len, max_seq_len)
    mask = np.arange(n * max_seq_len).reshape(n, max_seq_len) < episode_len
    return mask, mask.sum(axis=1).astype(np.int32)


def split_and_zero_pad(data: Any, max_seq_len: int) -> Any:
    """[L, ...] (nested) -> [ceil(L / max_seq_len), max_seq_len, ...], zero-padded at the end."""

    def split(leaf: np.ndarray) -> np.ndarray:
        n = num_sequences(len(leaf), max_seq_len)
        padded = np.zeros((n * max_seq_len, *leaf.shape[1:]), dtype=leaf.dtype)
        padded[: len(leaf)] = leaf
        return padded.reshape(n, max_seq_len, *leaf.shape[1:])

    return map_structure(split, data)


def padding_mask(episode_lens: list[int], max_seq_len: int) -> np.ndarray:
    """The [N, max_seq_len] validity mask of several episodes' sequences, one after the other."""
    return np.concatenate([create_mask_and_seq_lens(n, max_seq_len)[0] for n in episode_lens])


def unpad(data: np.ndarray, episode_lens: list[int]) -> np.ndarray:
    """[N, T, ...] zero-padded sequences -> the [sum(episode_lens), ...] steps; 1-D data is returned as is."""
    if data.ndim == 1:
        return data
    return data[padding_mask(episode_lens, data.shape[1])]


def pad(data: np.ndarray, episode_lens: list[int], max_seq_len: int) -> np.ndarray:
    """The inverse of `unpad`: [sum(episode_lens), ...] steps -> [N, max_seq_len, ...] zero-padded."""
    mask = padding_mask(episode_lens, max_seq_len)
    out = np.zeros((*mask.shape, *data.shape[1:]), dtype=data.dtype)
    out[mask] = data
    return out
