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
and the last slice of a (tile, head) to finish merges them all (an arrival counter).
Segments shorter than a tile (decode rows, short chunks) go to a second launch whose items take a
GQA group's heads as their rows (KernelPlan.pack): each K/V tile read once for the group.
Batch-invariant mode never splits nor packs.
"""

import functools

import torch
import triton
import triton.language as tl

from rlt.kernels.attention_steps import LOG2E, num_sms, paged_item

BLOCK_N = 64
# Pipeline stages of the launch of whole tiles and of the packed one (timed on an H200: 4 is faster
# on a prefix hit's split tiles, 3 on packed decode rows)
NUM_STAGES, PACKED_STAGES = 4, 3


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
        paged_item(
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
def _scratch(
    device: torch.device, slots: int, d_pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    num_stages (both launches'; None: NUM_STAGES and PACKED_STAGES) are for tuning."""
    T, H, D = q.shape
    # q is read in place (a view of the fused projection: rows strided, each head's D contiguous)
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    d_pad = max(16, triton.next_power_of_2(D))
    # (each slice's partial: BLOCK_M rows per item; a packed launch has as many slots, see
    # KernelPlan)
    part, ml, counters = _scratch(q.device, plan.split_items * H * plan.tile_rows, d_pad)
    launches = [
        (
            "tile_seg",
            "tile_row",
            "work",
            1,
            plan.tile_rows,
            plan.max_splits,
            num_stages or NUM_STAGES,
        )
    ]
    if plan.pack > 1:  # segments shorter than a tile: a GQA group's heads per item
        packed = (
            "packed_seg",
            "packed_row",
            "packed_work",
            plan.pack,
            plan.packed_rows,
            plan.packed_splits,
        )
        launches.append((*packed, num_stages or PACKED_STAGES))
    for tiles, first_rows, work, pack, tile_rows, splits, stages in launches:
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
            D**-0.5 * LOG2E,
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
            num_stages=stages,
        )
    return out
