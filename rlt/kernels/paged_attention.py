"""Paged attention: each group of rows reads its own block table (its own plane). The torch
reference (paged_attention), and the Triton kernels as a pass's KernelPlan picks them
(kernel_paged_attention).

Metadata is device tensors (slot mapping, padded block tables) plus the host integers the
reference's per-segment loop needs; GPU kernels take the same tensors.
"""

from dataclasses import dataclass

import numpy as np
import torch

from rlt.kernels.attention import causal_attention, prefix_free_attention

KERNEL_BLOCK_M = 16  # query rows per program of the Triton kernel (decode passes, batch-invariant mode)
PREFILL_BLOCK_M = 64  # passes carrying prompt chunks: fewer key re-reads per query row
DENSE_MIN_ROWS = 64  # a prefix-free prompt chunk this long runs as dense causal SDPA (flash)
MAX_SPLITS = 16  # key slices per tile of the general kernel
SPLIT_ITEMS = 8  # a split pass's tiles x slices, at most, per tile that fills the GPU


@dataclass(frozen=True)
class KernelPlan:
    """How the Triton attention runs one pass: rows per tile, which segments skip the paged kernel
    for dense SDPA instead (prompt chunks at position 0: their keys are their own rows), and whether
    the decode kernel takes the whole pass (one row per segment: a GQA group per program, keys
    split to fill the GPU)."""

    tile_rows: int = KERNEL_BLOCK_M
    dense: tuple[int, ...] = ()
    decode: bool = False
    # The general kernel's key slices: fill_tiles (tiles x heads filling the GPU, in tiles; 0: never
    # split, as batch-invariant mode) and the launch's slices, at most (a graph's: its bucket's most).
    fill_tiles: int = 0
    max_splits: int = 1
    # Query heads per work item of the general kernel: a GQA group's (each K/V tile read once for
    # all of them), its tile's rows x heads filling the kernel's rows (tile_rows = block // pack).
    pack: int = 1

    @property
    def block_m(self) -> int:
        """The general kernel's query rows per item: (row, head) pairs, a power of two."""
        return 1 << (self.tile_rows * self.pack - 1).bit_length()

    @property
    def split_items(self) -> int:
        """A split pass's tiles x slices, at most (the merge's scratch holds that many)."""
        return SPLIT_ITEMS * max(self.fill_tiles, 1)


def split_count(tiles: int, fill_tiles: int, most: int = MAX_SPLITS) -> int:
    """Key slices per tile for a pass of this many tiles: 1 from fill_tiles up, else the largest
    power of two keeping tiles x slices within SPLIT_ITEMS x fill_tiles (the merge's scratch)."""
    if tiles >= fill_tiles or tiles == 0:
        return 1
    return min(most, 1 << ((SPLIT_ITEMS * fill_tiles) // tiles).bit_length() - 1)


def plan_kernel(
    row_starts: list[int], q_starts: list[int], batch_invariant: bool, fill_tiles: int = 0, pack: int = 1
) -> KernelPlan:
    """Batch-invariant mode keeps one tiling for every pass, never takes the dense path, never
    splits keys, never packs heads and keeps decode-only passes on the general kernel, so a row's
    result never depends on how its prompt was chunked or what shares its pass. fill_tiles: tiles
    filling the GPU (in items of `pack` heads)."""
    if batch_invariant:
        return KernelPlan()
    if row_starts[-1] == len(row_starts) - 1:  # decode rows only
        return KernelPlan(decode=True)
    rows = np.diff(row_starts)
    if rows.max() <= KERNEL_BLOCK_M:
        dense, tile_rows = (), max(1, KERNEL_BLOCK_M // pack)
    else:
        dense = tuple(int(s) for s in np.flatnonzero((np.asarray(q_starts) == 0) & (rows >= DENSE_MIN_ROWS)))
        tile_rows = max(1, PREFILL_BLOCK_M // pack)
    tiles = int((-(-rows // tile_rows)).sum() - sum(-(-rows[s] // tile_rows) for s in dense))
    return KernelPlan(tile_rows, dense, fill_tiles=fill_tiles, max_splits=split_count(tiles, fill_tiles), pack=pack)


def kernel_fields(row_starts: list[int], q_starts: list[int], plan: KernelPlan = KernelPlan()) -> dict[str, np.ndarray]:
    """The launch's integer metadata: each tile's segment and first row (tiles of plan.tile_rows
    rows, those with the most keys first; none for dense segments), each segment's first row, row
    count and first position, and the pass's work: [key slices per tile, tiles]."""
    rows = np.diff(np.asarray(row_starts, dtype=np.int64))
    per_seg = -(-rows // plan.tile_rows)
    per_seg[list(plan.dense)] = 0
    tile_seg = np.repeat(np.arange(len(rows)), per_seg)
    first_tile = np.cumsum(per_seg) - per_seg
    tile_row = (np.arange(len(tile_seg)) - np.repeat(first_tile, per_seg)) * plan.tile_rows
    keys = np.asarray(q_starts, dtype=np.int64)[tile_seg] + np.minimum(tile_row + plan.tile_rows, rows[tile_seg])
    order = np.argsort(-keys, kind="stable")  # the queue hands the longest out first
    tile_seg, tile_row = tile_seg[order], tile_row[order]
    return {
        "tile_seg": tile_seg,
        "tile_row": tile_row,
        "seg_row0": np.asarray(row_starts[:-1], dtype=np.int64),
        "seg_rows": rows,
        "seg_q0": np.asarray(q_starts, dtype=np.int64),
        "work": np.array([split_count(len(tile_seg), plan.fill_tiles, plan.max_splits), len(tile_seg)]),
    }


@dataclass
class PagedMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) each row's K/V goes to
    block_table: torch.Tensor  # [S, max_blocks] physical blocks of each segment's plane
    row_starts: list[int]  # [S + 1] rows of segment s are row_starts[s]:row_starts[s+1]
    q_starts: list[int]  # [S] position of each segment's first row
    block_size: int
    kernel: dict | None = None  # kernel_fields (the Triton kernels); packed: device copies
    plan: KernelPlan = KernelPlan()  # the tiling those fields were built for, and the kernel

    def kv_len(self, s: int) -> int:
        return self.q_starts[s] + self.row_starts[s + 1] - self.row_starts[s]


def write_kv(cache: torch.Tensor, layer: int, meta: PagedMetadata, k: torch.Tensor, v: torch.Tensor) -> None:
    """cache [num_blocks, layers, 2, block_size, Hkv, D], the reference (CUDA kernels store K/V in
    the RoPE launch: rlt/kernels/rope.rope_write_kv)."""
    block, offset = meta.slot_mapping // meta.block_size, meta.slot_mapping % meta.block_size
    cache[block, layer, 0, offset] = k
    cache[block, layer, 1, offset] = v


def paged_attention(
    cache: torch.Tensor, layer: int, meta: PagedMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] of the same rows (already written to the cache) -> [T, H, D]:
    the torch reference, a loop over the segments."""
    out = torch.empty_like(q)
    for s in range(len(meta.q_starts)):
        r0, r1, kv_len = meta.row_starts[s], meta.row_starts[s + 1], meta.kv_len(s)
        kv = cache[meta.block_table[s, : -(-kv_len // meta.block_size)], layer]  # [nb, 2, bs, Hkv, D]
        K, V = kv[:, 0].flatten(0, 1)[:kv_len], kv[:, 1].flatten(0, 1)[:kv_len]
        if meta.q_starts[s] == 0:  # no prefix: its keys are its own rows (flash SDPA, linear memory)
            out[r0:r1] = prefix_free_attention(q[r0:r1], K, V)
        else:
            out[r0:r1] = causal_attention(q[r0:r1], K, V, meta.q_starts[s])
    return out


def kernel_paged_attention(
    cache: torch.Tensor, layer: int, meta: PagedMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """The same by the Triton kernels, as meta.plan says: the decode kernel, or the general paged
    kernel over every segment in one launch (dense segments of the plan as causal SDPA on k/v)."""
    from rlt.kernels import paged_attention_triton as pat

    if meta.plan.decode:
        from rlt.kernels.decode_attention import decode_attention

        return decode_attention(cache, layer, q, meta.block_table, meta.kernel["seg_q0"], meta.block_size)
    if meta.plan.dense == (0,) and len(meta.q_starts) == 1:  # a lone prompt chunk: no copy into a buffer
        return prefix_free_attention(q, k, v)
    out = pat.paged_attention(cache, layer, q, meta.block_table, meta.kernel, meta.block_size, meta.plan)
    for s in meta.plan.dense:
        r0, r1 = meta.row_starts[s], meta.row_starts[s + 1]
        out[r0:r1] = prefix_free_attention(q[r0:r1], k[r0:r1], v[r0:r1])
    return out
