"""A pass's rows, laid out for the device: each row's position, the KV slots its keys and values go
to, block tables padded into one array, and the models' Attention interface over the paged pool."""

import numpy as np

from rlt.kernels.paged_attention import PagedMetadata, paged_attention, write_kv
from rlt.models.base import Rotary
from rlt.models.layers import rope
from rlt.workers.progress import Progress


class Attention:
    """The models' Attention interface over the paged pool, for one pass."""

    def __init__(self, cache, core: PagedMetadata | None, boundary: PagedMetadata | None):
        self.cache, self.core_meta, self.boundary_meta = cache, core, boundary

    def core(self, layer, q, k, v, rotary: Rotary):
        return self._attend(self.core_meta, layer, q, k, v, rotary)

    def boundary(self, layer, q, k, v, rotary: Rotary):
        return self._attend(self.boundary_meta, layer, q, k, v, rotary)

    def _attend(self, meta: PagedMetadata, layer, q, k, v, rotary: Rotary):
        Progress.count += 1  # a layer of the pass: a long step is not a stuck one
        if meta.kernel is not None:  # CUDA kernels: RoPE and the K/V store in one launch
            from rlt.kernels.rope import rope_write_kv

            rope_write_kv(q, k, v, *rotary, self.cache, layer, meta.slot_mapping, meta.block_size)
        else:
            q, k = rope(q, k, *rotary)
            write_kv(self.cache, layer, meta, k, v)
        return paged_attention(self.cache, layer, meta, q, k, v)


def kv_slots(table: list[int], start: int, n: int, bs: int) -> list[int]:
    return [table[p // bs] * bs + p % bs for p in range(start, start + n)]


def row_starts(groups: list) -> list[int]:
    return np.cumsum([0] + [g.n for g in groups]).tolist()


def positions(groups: list, row_starts: list[int]) -> np.ndarray:
    """Every row's position, in pass order (groups are runs of consecutive positions)."""
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
