"""Paged attention in Triton: every query row of every segment in one launch (two with GQA packing).

A segment is a run of rows of one request at one plane (a prompt chunk, or one decode token);
each reads its own block table, so rows at different loop depths share the launch. Flash-style:
keys stream through in BLOCK_N tiles with an online softmax in float32, causal by position. Passes
carrying prompt chunks (and every pass in batch-invariant mode) run here; decode-only passes take
rlt/kernels/decode_attention.py. Same call and metadata as rlt/kernels/paged_attention.py (the
reference it is tested against).

A launch is a couple of programs per SM taking work items (tile, head, key slice) from a queue:
a graph captured for a bucket's most tiles launches nothing for the padding, and items of unequal
length (causal tiles, long and short contexts) balance as they finish. A pass of few tiles (a
prefix hit's new rows over a long cached context, a small chunk) would leave most of the GPU idle
while each item walks every key: then each tile's keys are split into slices (flash-decoding), the
pass's slice count in the metadata (a device value, so one graph serves every pass of its bucket),
and the last slice of a (tile, head) to finish merges them all, as the decode kernel does.
Segments shorter than a tile (decode rows, short chunks) go to a second launch whose items take a
GQA group's heads as their rows (KernelPlan.pack): each K/V tile read once for the group.
Batch-invariant mode never splits nor packs.
"""

import functools

import torch
import triton
import triton.language as tl

from rlt.kernels.attention_steps import kv_tile, merge_slices, num_sms, softmax_step

BLOCK_N = 64


@triton.jit
def _attend(
    q_ptr,
    o_ptr,
    cache_ptr,
    table_ptr,
    tile_seg_ptr,
    tile_row_ptr,
    seg_row0_ptr,
    seg_rows_ptr,
    seg_q0_ptr,
    part_ptr,
    ml_ptr,
    count_ptr,
    tile,
    head,
    packs,
    split,
    splits,
    layer,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cl,
    stride_ckv,
    stride_co,
    stride_ch,
    stride_ts,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PACK: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One work item: attention of a tile's TILE_ROWS rows for PACK query heads sharing a K/V head
    (`head` counts such packs of heads) over their keys (causal by position), or over one slice of
    them (SPLIT), merged by the slice that finishes last. The item's BLOCK_M query rows are (row,
    head) pairs, row-major: packing a GQA group reads each K/V tile once for all of its heads."""
    kv_head = head * PACK // GROUP
    seg = tl.load(tile_seg_ptr + tile)
    r0 = tl.load(tile_row_ptr + tile)  # first row of this tile, relative to the segment
    seg_row0 = tl.load(seg_row0_ptr + seg)
    n_rows = tl.load(seg_rows_ptr + seg)
    q0 = tl.load(seg_q0_ptr + seg)  # position of the segment's first row
    kv_end = q0 + tl.minimum(r0 + TILE_ROWS, n_rows)  # keys up to the tile's last row position
    chunk = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), splits) * BLOCK_N
    lo = split * chunk
    # (a slice past the tile's keys has nothing to do or merge: the merge counts the working ones)
    if lo < kv_end:
        hi = tl.minimum(lo + chunk, kv_end)
        i = tl.arange(0, BLOCK_M)
        offs_m = r0 + i // PACK
        q_head = head * PACK + i % PACK
        offs_d = tl.arange(0, D_PAD)  # head_dim padded to a power of two (Huginn: 96 -> 128)
        d_ok = offs_d < HEAD_DIM
        row_ok = (i < TILE_ROWS * PACK) & (offs_m < n_rows)
        rows = seg_row0 + offs_m
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + q_head[:, None] * stride_qh + offs_d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        q_pos = q0 + offs_m
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
        base = cache_ptr + layer * stride_cl + kv_head * stride_ch
        table = table_ptr + seg * stride_ts
        for n0 in range(lo, hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            key_ok = pos < hi
            k, v = kv_tile(base, table, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE)
            m_i, l_i, acc = softmax_step(
                q, k, v, (pos[None, :] <= q_pos[:, None]) & key_ok[None, :], m_i, l_i, acc, scale, IEEE
            )
        o_rows = o_ptr + rows[:, None] * stride_ot + q_head[:, None] * stride_oh + offs_d[None, :]
        o_mask = row_ok[:, None] & d_ok[None, :]
        working = tl.cdiv(kv_end, chunk)  # slices holding keys: the first ones
        if SPLIT and working > 1:
            # a slot per (tile, head, slice): split passes keep tiles x slices within the scratch
            pair = tile * packs + head
            slot = (pair * splits + split) * BLOCK_M + tl.arange(0, BLOCK_M)
            tl.store(part_ptr + slot[:, None] * D_PAD + offs_d[None, :], acc)
            tl.store(ml_ptr + slot * 2, m_i)
            tl.store(ml_ptr + slot * 2 + 1, l_i)
            # the split-K handshake of rlt/kernels/decode_attention.py: the last arrival merges
            tl.debug_barrier()
            if tl.atomic_add(count_ptr + pair, 1, sem="acq_rel") == working - 1:
                out = merge_slices(part_ptr, ml_ptr, pair * splits, working, BLOCK_M, D_PAD)
                tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(count_ptr + pair, 0)
        else:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)


# Layer indices, head counts and table widths vary: one variant serves them all (Triton would
# otherwise build one per value class, 1 / multiple of 16 / other, the first time each appears).
@triton.jit(do_not_specialize=["layer", "packs", "stride_ts"])
def _paged_attn_kernel(
    q_ptr,
    o_ptr,
    cache_ptr,
    table_ptr,
    tile_seg_ptr,
    tile_row_ptr,
    seg_row0_ptr,
    seg_rows_ptr,
    seg_q0_ptr,
    work_ptr,
    queue_ptr,
    part_ptr,
    ml_ptr,
    count_ptr,
    packs,
    layer,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cl,
    stride_ckv,
    stride_co,
    stride_ch,
    stride_ts,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PACK: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    """A few programs per SM take work items (tile, pack of query heads, key slice) from a queue,
    longest tiles first (the host orders them), until none is left: no program is launched for a
    graph's padding and the items balance as they finish. The last program out resets the queue."""
    splits = 1
    if SPLIT:
        splits = tl.load(work_ptr)
    n_work = tl.load(work_ptr + 1) * packs * splits  # work_ptr: [slices, tiles]
    w = tl.atomic_add(queue_ptr, 1, sem="relaxed")
    while w < n_work:
        th = w // splits
        _attend(
            q_ptr,
            o_ptr,
            cache_ptr,
            table_ptr,
            tile_seg_ptr,
            tile_row_ptr,
            seg_row0_ptr,
            seg_rows_ptr,
            seg_q0_ptr,
            part_ptr,
            ml_ptr,
            count_ptr,
            th // packs,
            th % packs,
            packs,
            w % splits,
            splits,
            layer,
            scale,
            stride_qt,
            stride_qh,
            stride_ot,
            stride_oh,
            stride_cb,
            stride_cl,
            stride_ckv,
            stride_co,
            stride_ch,
            stride_ts,
            GROUP,
            BLOCK_SIZE,
            HEAD_DIM,
            D_PAD,
            BLOCK_M,
            BLOCK_N,
            PACK,
            TILE_ROWS,
            SPLIT,
            IEEE,
        )
        w = tl.atomic_add(queue_ptr, 1, sem="relaxed")
    if tl.atomic_add(queue_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        tl.atomic_xchg(queue_ptr, 0)
        tl.atomic_xchg(queue_ptr + 1, 0)


@functools.cache
def _programs(device: torch.device) -> int:
    """Programs the general kernel launches at most: a couple resident per SM (it takes most of an
    SM's registers); a few under the interpreter."""
    return 2 * num_sms(device) if device.type == "cuda" else 3


@functools.cache
def _queue(device: torch.device) -> torch.Tensor:
    """The work queue's next item and programs done (zero between launches: the last one out resets)."""
    return torch.zeros(2, dtype=torch.int32, device=device)


@functools.cache
def _scratch(device: torch.device, slots: int, d_pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A split pass's partial outputs, their running max and sum, and the arrival counters (zero
    between launches: the merging slice resets its own), for up to `slots` (tile, head, slice) rows."""
    return (
        torch.empty(slots, d_pad, dtype=torch.float32, device=device),
        torch.empty(2 * slots, dtype=torch.float32, device=device),
        torch.zeros(slots, dtype=torch.int32, device=device),
    )


def paged_attention(
    cache: torch.Tensor,
    layer: int,
    q: torch.Tensor,
    block_table: torch.Tensor,
    k: dict,
    block_size: int,
    plan,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """q [T, H, D] (K/V already written; last dim contiguous) -> [T, H, D]. cache [blocks, layers, 2,
    block_size, Hkv, D]; k: kernel_fields() as device tensors, built for this KernelPlan (its tiles, its key
    slices at most; with plan.pack > 1 a second launch for the packed tiles). Rows of no tile (dense
    segments) are left for the caller. block_n, num_warps and
    num_stages (None: Triton's) are for tuning (scripts/tune_paged.py)."""
    T, H, D = q.shape
    # q is read in place (a view of the fused projection: rows strided, each head's D contiguous)
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    d_pad = max(16, triton.next_power_of_2(D))
    # (each slice's partial: BLOCK_M rows per item; a packed launch has as many slots, see KernelPlan)
    part, ml, counters = _scratch(q.device, plan.split_items * H * plan.tile_rows, d_pad)
    launches = [("tile_seg", "tile_row", "work", 1, plan.tile_rows, plan.max_splits)]
    if plan.pack > 1:  # segments shorter than a tile: a GQA group's heads per item
        launches.append(("packed_seg", "packed_row", "packed_work", plan.pack, plan.packed_rows, plan.packed_splits))
    for tiles, first_rows, work, pack, tile_rows, splits in launches:
        n_tiles = k[tiles].numel()  # (a graph's: its bucket's most)
        if n_tiles == 0:
            continue
        _paged_attn_kernel[(min(n_tiles * (H // pack) * splits, _programs(q.device)),)](
            q,
            out,
            cache,
            block_table,
            k[tiles],
            k[first_rows],
            k["seg_row0"],
            k["seg_rows"],
            k["seg_q0"],
            k[work],
            _queue(q.device),
            part,
            ml,
            counters,
            H // pack,
            layer,
            D**-0.5,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            cache.stride(0),
            cache.stride(1),
            cache.stride(2),
            cache.stride(3),
            cache.stride(4),
            block_table.stride(0),
            GROUP=H // cache.shape[4],
            BLOCK_SIZE=block_size,
            HEAD_DIM=D,
            D_PAD=d_pad,
            BLOCK_M=plan.tile_rows,
            BLOCK_N=block_n,
            PACK=pack,
            TILE_ROWS=tile_rows,
            SPLIT=splits > 1,
            IEEE=q.dtype == torch.float32,
            num_warps=num_warps,
            **({} if num_stages is None else {"num_stages": num_stages}),
        )
    return out
