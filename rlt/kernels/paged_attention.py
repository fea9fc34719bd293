"""Torch reference paged attention: each group of rows reads its own block table (its own plane).

The GPU kernels of rlt/kernels replace this behind the same call; this one runs on CPU and is what
they are checked against.
"""

from dataclasses import dataclass

import torch

from rlt.kernels.attention import causal_attention


@dataclass
class PagedSegment:
    """Rows [row_start, row_end) of one request, positions q_start.., over one plane's blocks."""

    row_start: int
    row_end: int
    q_start: int
    blocks: torch.Tensor  # physical blocks covering positions 0..q_start + rows - 1
    kv_len: int


@dataclass
class PagedMetadata:
    slot_block: torch.Tensor  # [T] physical block each row's K/V is written to
    slot_offset: torch.Tensor  # [T] offset inside that block
    segments: list[PagedSegment]


def write_kv(cache: torch.Tensor, layer: int, meta: PagedMetadata, k: torch.Tensor, v: torch.Tensor) -> None:
    cache[meta.slot_block, layer, 0, meta.slot_offset] = k
    cache[meta.slot_block, layer, 1, meta.slot_offset] = v


def paged_attention(cache: torch.Tensor, layer: int, meta: PagedMetadata, q: torch.Tensor) -> torch.Tensor:
    """q [T, H, D] (K/V of these rows already written) -> [T, H, D]."""
    out = torch.empty_like(q)
    for s in meta.segments:
        kv = cache[s.blocks, layer]  # [nb, 2, bs, Hkv, D]
        K = kv[:, 0].flatten(0, 1)[: s.kv_len]
        V = kv[:, 1].flatten(0, 1)[: s.kv_len]
        out[s.row_start:s.row_end] = causal_attention(q[s.row_start:s.row_end], K, V, s.q_start)
    return out
