"""Paged attention: each group of rows reads its own block table (its own plane). The torch
reference (paged_attention), and the Triton kernels as a pass's KernelPlan picks them
(kernel_paged_attention).

Metadata is device tensors (slot mapping, padded block tables) plus the host integers the
reference's per-segment loop needs; GPU kernels take the same tensors.
"""

import functools
import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlt.kernels.attention import causal_attention, prefix_free_attention

# query rows per program of the Triton kernel (decode passes, batch-invariant mode)
KERNEL_BLOCK_M = 16
PREFILL_BLOCK_M = 64  # passes carrying prompt chunks: fewer key re-reads per query row
DENSE_MIN_ROWS = 64  # a prefix-free prompt chunk this long runs as dense causal SDPA (flash)
MAX_SPLITS = 16  # key slices per tile of the general kernel
# a split pass's tiles x slices, at most, per tile that fills the GPU: one wave of items
SPLIT_ITEMS = 2


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
    # split, as batch-invariant mode) and the launch's slices, at most (a graph's: its bucket's
    # most).
    fill_tiles: int = 0
    max_splits: int = 1
    # pack > 1 (a GQA group's query heads): segments shorter than a tile (decode rows, short chunks)
    # go to a second launch whose items take the group's heads over tile_rows // pack rows, so each
    # K/V tile is read once for the group where a lone row's tile read it once per head; longer
    # segments' tiles already share each K/V tile among tile_rows rows. Its slices, at most:
    pack: int = 1
    packed_splits: int = 1

    @property
    def packed_rows(self) -> int:
        return max(1, self.tile_rows // self.pack)

    @property
    def packed_fill(self) -> int:
        """Packed tiles filling the GPU (each has heads / pack items)."""
        return self.fill_tiles * self.pack

    @property
    def split_items(self) -> int:
        """A split pass's tiles x slices, at most (the merge's scratch holds that many; a packed
        launch's: pack times as many, of heads / pack items each)."""
        return SPLIT_ITEMS * max(self.fill_tiles, 1)


def split_count(tiles: int, fill_tiles: int, most: int = MAX_SPLITS) -> int:
    """Key slices per tile for a pass of this many tiles: 1 from fill_tiles up, else the largest
    power of two keeping tiles x slices within SPLIT_ITEMS x fill_tiles (the merge's scratch)."""
    if tiles >= fill_tiles or tiles == 0:
        return 1
    return min(most, 1 << ((SPLIT_ITEMS * fill_tiles) // tiles).bit_length() - 1)


def _segments(rows: np.ndarray, plan: KernelPlan) -> tuple[np.ndarray, np.ndarray]:
    """Which segments the general kernel takes in tiles of one head, and which packed (none but
    with plan.pack > 1: those shorter than a tile); dense ones in neither."""
    paged = np.ones(len(rows), dtype=bool)
    paged[list(plan.dense)] = False
    packed = paged & (rows < plan.tile_rows) if plan.pack > 1 else np.zeros(len(rows), dtype=bool)
    return paged & ~packed, packed


def plan_kernel(
    row_starts: list[int],
    q_starts: list[int],
    batch_invariant: bool,
    fill_tiles: int = 0,
    pack: int = 1,
) -> KernelPlan:
    """Batch-invariant mode keeps one tiling for every pass, never takes the dense path, never
    splits keys, never packs heads and keeps decode-only passes on the general kernel, so a row's
    result never depends on how its prompt was chunked or what shares its pass. fill_tiles: tiles
    of one head filling the GPU; pack: the GQA group."""
    if batch_invariant:
        return KernelPlan()
    if row_starts[-1] == len(row_starts) - 1:  # decode rows only
        return KernelPlan(decode=True)
    rows = np.diff(row_starts)
    if rows.max() <= KERNEL_BLOCK_M:
        dense, tile_rows = (), KERNEL_BLOCK_M
    else:
        dense = tuple(
            int(s) for s in np.flatnonzero((np.asarray(q_starts) == 0) & (rows >= DENSE_MIN_ROWS))
        )
        tile_rows = PREFILL_BLOCK_M
    plan = KernelPlan(tile_rows, dense, fill_tiles=fill_tiles, pack=pack)
    whole, packed = _segments(rows, plan)
    tiles, packed_tiles = (
        int((-(-rows[whole] // tile_rows)).sum()),
        int((-(-rows[packed] // plan.packed_rows)).sum()),
    )
    return replace(
        plan,
        max_splits=split_count(tiles, fill_tiles),
        packed_splits=split_count(packed_tiles, plan.packed_fill) if pack > 1 else 1,
    )


def _tiles(
    rows: np.ndarray, q_starts, take: np.ndarray, tile_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """(segment, first row) of each tile of tile_rows rows of the segments `take`, those with the
    most keys first (the kernel's queue hands the longest out first)."""
    per_seg = np.where(take, -(-rows // tile_rows), 0)
    tile_seg = np.repeat(np.arange(len(rows)), per_seg)
    first_tile = np.cumsum(per_seg) - per_seg
    tile_row = (np.arange(len(tile_seg)) - np.repeat(first_tile, per_seg)) * tile_rows
    keys = np.asarray(q_starts, dtype=np.int64)[tile_seg] + np.minimum(
        tile_row + tile_rows, rows[tile_seg]
    )
    order = np.argsort(-keys, kind="stable")
    return tile_seg[order], tile_row[order]


def kernel_fields(
    row_starts: list[int], q_starts: list[int], plan: KernelPlan = KernelPlan()
) -> dict[str, np.ndarray]:
    """The launch's integer metadata: each tile's segment and first row (tiles of plan.tile_rows
    rows, those with the most keys first; none for dense segments), each segment's first row, row
    count and first position, and the pass's work: [key slices per tile, tiles]; with plan.pack > 1
    the same of the packed launch's tiles (packed_seg, packed_row, packed_work)."""
    rows = np.diff(np.asarray(row_starts, dtype=np.int64))
    whole, packed = _segments(rows, plan)
    tile_seg, tile_row = _tiles(rows, q_starts, whole, plan.tile_rows)
    out = {
        "tile_seg": tile_seg,
        "tile_row": tile_row,
        "seg_row0": np.asarray(row_starts[:-1], dtype=np.int64),
        "seg_rows": rows,
        "seg_q0": np.asarray(q_starts, dtype=np.int64),
        "work": np.array(
            [split_count(len(tile_seg), plan.fill_tiles, plan.max_splits), len(tile_seg)]
        ),
    }
    if plan.pack > 1:
        seg, row = _tiles(rows, q_starts, packed, plan.packed_rows)
        splits = split_count(len(seg), plan.packed_fill, plan.packed_splits)
        out |= {"packed_seg": seg, "packed_row": row, "packed_work": np.array([splits, len(seg)])}
    return out


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

    @functools.cached_property
    def blocks(self) -> tuple[torch.Tensor, list[int]]:
        """The blocks holding each segment's keys, segment after segment, and where each segment's
        start in them: the reference gathers a layer's keys for the whole pass at once."""
        counts = [-(-self.kv_len(s) // self.block_size) for s in range(len(self.q_starts))]
        # (a pass graph's table has a row per row of its bucket)
        table = self.block_table[: len(counts)]
        held = (
            torch.arange(table.shape[1], device=table.device)
            < torch.tensor(counts, device=table.device)[:, None]
        )
        return table[held], list(itertools.accumulate(counts, initial=0))


def write_kv(
    cache: torch.Tensor, layer: int, meta: PagedMetadata, k: torch.Tensor, v: torch.Tensor
) -> None:
    """cache [num_blocks, layers, 2, block_size, Hkv, D], the reference (CUDA kernels store K/V in
    the RoPE launch: rlt/kernels/rope.rope_write_kv)."""
    block, offset = meta.slot_mapping // meta.block_size, meta.slot_mapping % meta.block_size
    cache[block, layer, 0, offset] = k
    cache[block, layer, 1, offset] = v


def paged_attention(
    cache: torch.Tensor,
    layer: int,
    meta: PagedMetadata,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] of the same rows (already written to the cache) -> [T, H, D]:
    the torch reference, a loop over the segments."""
    out = torch.empty_like(q)
    blocks, first = meta.blocks
    keys, values = cache[blocks, layer, 0], cache[blocks, layer, 1]  # [blocks, bs, Hkv, D] each
    for s in range(len(meta.q_starts)):
        r0, r1, kv_len = meta.row_starts[s], meta.row_starts[s + 1], meta.kv_len(s)
        K = keys[first[s] : first[s + 1]].flatten(0, 1)[:kv_len]
        V = values[first[s] : first[s + 1]].flatten(0, 1)[:kv_len]
        # no prefix: its keys are its own rows (flash SDPA, linear memory)
        if meta.q_starts[s] == 0:
            out[r0:r1] = prefix_free_attention(q[r0:r1], K, V)
        else:
            out[r0:r1] = causal_attention(q[r0:r1], K, V, meta.q_starts[s])
    return out


def kernel_paged_attention(
    cache: torch.Tensor,
    layer: int,
    meta: PagedMetadata,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """The same by the Triton kernels, as meta.plan says: the decode kernel, or the general paged
    kernel over every segment in one launch (dense segments of the plan as causal SDPA on k/v)."""
    from rlt.kernels import paged_attention_triton as pat

    if meta.plan.decode:
        from rlt.kernels.decode_attention import decode_attention

        return decode_attention(
            cache, layer, q, meta.block_table, meta.kernel["seg_q0"], meta.block_size
        )
    # a lone prompt chunk: no copy into a buffer
    if meta.plan.dense == (0,) and len(meta.q_starts) == 1:
        return prefix_free_attention(q, k, v)
    out = pat.paged_attention(
        cache, layer, q, meta.block_table, meta.kernel, meta.block_size, meta.plan
    )
    for s in meta.plan.dense:
        r0, r1 = meta.row_starts[s], meta.row_starts[s + 1]
        out[r0:r1] = prefix_free_attention(q[r0:r1], k[r0:r1], v[r0:r1])
    return out
