"""Paged attention in Triton: every query row of every segment in one launch.

A segment is a run of rows of one request at one plane (a prompt chunk, or one decode token);
each reads its own block table, so rows at different loop depths share the launch. Flash-style:
keys stream through in BLOCK_N tiles with an online softmax in float32, causal by position. Passes
carrying prompt chunks (and every pass in batch-invariant mode) run here; decode-only passes take
rlt/kernels/decode_attention.py. Same call and metadata as rlt/kernels/paged_attention.py (the
reference it is tested against).

A pass of few tiles (a prefix hit's new rows over a long cached context, a small chunk) would leave
most of the GPU idle while each program walks every key: then each tile's keys are split into
slices (flash-decoding), the pass's slice count in the metadata (a device value, so one graph serves
every pass of its bucket), and the last slice of a (tile, head) to finish merges them all, as the
decode kernel does. Batch-invariant mode never splits.
"""

import functools

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def kv_tile(base, table_row_ptr, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE: tl.constexpr):
    """K and V [len(pos), D_PAD] of one head at positions pos, through the block table (masked keys
    read as 0)."""
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=key_ok, other=0)
    off = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co
    kv_mask = key_ok[:, None] & d_ok[None, :]
    k = tl.load(base + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(base + stride_ckv + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def softmax_step(q, k, v, allowed, m_i, l_i, acc, scale, IEEE: tl.constexpr):
    """One key tile of the online softmax in float32: scores q k^T (only `allowed` [M, N] count),
    running max m_i, sum l_i and unnormalised output acc updated."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc


@triton.jit
def _merge_slices(part_ptr, ml_ptr, first, working, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr):
    """One (tile, head)'s output from its first `working` slices' partials (slots first, first + 1,
    ...): sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M the rows' overall max."""
    offs_d = tl.arange(0, D_PAD)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    for s in range(working):
        slot = (first + s) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_s = tl.load(ml_ptr + slot * 2)
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a_old, a_s = tl.exp(m_i - m_safe), tl.exp(m_s - m_safe)
        l_i = l_i * a_old + tl.load(ml_ptr + slot * 2 + 1) * a_s
        acc = acc * a_old[:, None] + tl.load(part_ptr + slot[:, None] * D_PAD + offs_d[None, :]) * a_s[:, None]
        m_i = m_new
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


# Layer indices and table widths vary from pass to pass: one variant serves them all (Triton would
# otherwise build one per value class, 1 / multiple of 16 / other, the first time each appears).
@triton.jit(do_not_specialize=["layer", "stride_ts"])
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
    splits_ptr,
    part_ptr,
    ml_ptr,
    count_ptr,
    layer,
    scale,
    stride_qt,
    stride_qh,
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
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One (tile, head, key slice): attention of the tile's rows over their keys (causal by
    position), or over one slice of them (SPLIT), merged by the slice that finishes last."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seg = tl.load(tile_seg_ptr + tile)
    r0 = tl.load(tile_row_ptr + tile)  # first row of this tile, relative to the segment
    seg_row0 = tl.load(seg_row0_ptr + seg)
    n_rows = tl.load(seg_rows_ptr + seg)
    q0 = tl.load(seg_q0_ptr + seg)  # position of the segment's first row
    kv_end = q0 + tl.minimum(r0 + BLOCK_M, n_rows)  # keys up to the tile's last row position
    lo = 0
    hi = kv_end
    if SPLIT:
        splits = tl.load(splits_ptr)
        chunk = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), splits) * BLOCK_N
        lo = tl.program_id(2) * chunk
        if lo >= kv_end:  # a slice past the tile's keys (or past the pass's count): nothing to merge
            return
        hi = tl.minimum(lo + chunk, kv_end)
    offs_m = r0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)  # head_dim padded to a power of two (Huginn: 96 -> 128)
    d_ok = offs_d < HEAD_DIM
    row_ok = offs_m < n_rows
    rows = seg_row0 + offs_m
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = q0 + offs_m
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    base = cache_ptr + layer * stride_cl + kv_head * stride_ch
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < hi
        k, v = kv_tile(
            base, table_ptr + seg * stride_ts, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE
        )
        m_i, l_i, acc = softmax_step(
            q, k, v, (pos[None, :] <= q_pos[:, None]) & key_ok[None, :], m_i, l_i, acc, scale, IEEE
        )
    o_rows = o_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    o_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        working = tl.cdiv(kv_end, chunk)  # slices holding keys: the first ones
        if working > 1:
            # a slot per (tile, head, slice): split passes keep tiles x slices within the scratch
            pair = tile * tl.num_programs(1) + head
            slot = (pair * splits + tl.program_id(2)) * BLOCK_M + tl.arange(0, BLOCK_M)
            tl.store(part_ptr + slot[:, None] * D_PAD + offs_d[None, :], acc)
            tl.store(ml_ptr + slot * 2, m_i)
            tl.store(ml_ptr + slot * 2 + 1, l_i)
            # the split-K handshake of rlt/kernels/decode_attention.py: the last arrival merges
            tl.debug_barrier()
            if tl.atomic_add(count_ptr + pair, 1, sem="acq_rel") == working - 1:
                out = _merge_slices(part_ptr, ml_ptr, pair * splits, working, BLOCK_M, D_PAD)
                tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(count_ptr + pair, 0)
            return
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)


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
) -> torch.Tensor:
    """q [T, H, D] (K/V already written) -> [T, H, D]. cache [blocks, layers, 2, block_size, Hkv, D];
    k: kernel_fields() as device tensors, built for this KernelPlan (its tiles, its key slices at
    most). Rows of no tile (dense segments) are left for the caller."""
    T, H, D = q.shape
    tile_seg, tile_row, seg_row0, seg_rows, seg_q0 = (
        k[n] for n in ("tile_seg", "tile_row", "seg_row0", "seg_rows", "seg_q0")
    )
    q = q.contiguous()
    out = torch.empty_like(q)
    n_tiles = tile_seg.numel()
    if n_tiles == 0:
        return out
    d_pad = max(16, triton.next_power_of_2(D))
    split = plan.max_splits > 1
    # (split: tiles x slices <= 4 x fill_tiles, each slice's partial BLOCK_M rows per head)
    part, ml, counters = _scratch(q.device, 4 * max(plan.fill_tiles, 1) * H * plan.tile_rows, d_pad)
    _paged_attn_kernel[(n_tiles, H, plan.max_splits)](
        q,
        out,
        cache,
        block_table,
        tile_seg,
        tile_row,
        seg_row0,
        seg_rows,
        seg_q0,
        k["splits"] if split else seg_q0,
        part,
        ml,
        counters,
        layer,
        D**-0.5,
        q.stride(0),
        q.stride(1),
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
        BLOCK_N=BLOCK_N,
        SPLIT=split,
        IEEE=q.dtype == torch.float32,
    )
    return out
