"""A pass's rows, laid out for the device: each row's position, the KV slots its keys and values go
to, and block tables padded into one array."""

import itertools

import numpy as np


def kv_slots(table: list[int], start: int, n: int, bs: int) -> list[int]:
    return [table[p // bs] * bs + p % bs for p in range(start, start + n)]


def row_slots(tables: np.ndarray, row_starts: list[int], pos: np.ndarray, bs: int) -> np.ndarray:
    """The KV slot of every row of a pass: its group's block table (`padded`) at the row's position
    (vectorized: a 4,096-row prompt's slots in microseconds, not a Python loop per row)."""
    # (one group, a lone prompt chunk or decode row: its table without a per-row group index)
    group = 0 if len(tables) == 1 else np.repeat(np.arange(len(tables)), np.diff(row_starts))
    return tables[group, pos // bs] * bs + pos % bs


def row_starts(groups: list) -> list[int]:
    return list(itertools.accumulate((g.n for g in groups), initial=0))


def positions(groups: list, row_starts: list[int]) -> np.ndarray:
    """Every row's position, in pass order (groups are runs of consecutive positions)."""
    if len(groups) == 1:  # (a lone prompt chunk, or one decode row)
        return np.arange(groups[0].start, groups[0].start + groups[0].n)
    starts = np.fromiter((g.start for g in groups), np.int64, len(groups))
    if row_starts[-1] == len(groups):  # one row each (decode): no per-group ranges
        return starts
    offsets = np.arange(row_starts[-1]) - np.repeat(row_starts[:-1], np.diff(row_starts))
    return np.repeat(starts, np.diff(row_starts)) + offsets


def padded(tables: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(tables), max(1, max(len(t) for t in tables))), dtype=np.int64)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out
