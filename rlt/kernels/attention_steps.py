"""Device functions of the Triton attention kernels (the general paged kernel and the decode kernel):
a tile of keys and values read through a block table, one step of the online softmax, the general
kernel's merge of key slices, and its work item (a tile's rows over their keys or a slice of them)."""

import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores are scaled into log2 units: the softmax runs on exp2


@triton.jit
def kv_tile(
    base,
    table_row_ptr,
    pos,
    key_ok,
    offs_d,
    d_ok,
    stride_cb,
    stride_co,
    stride_ckv,
    BLOCK_SIZE: tl.constexpr,
):
    """K and V [len(pos), D_PAD] of one head at positions pos, through the block table (masked keys
    read as 0)."""
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=key_ok, other=0)
    off = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co
    kv_mask = key_ok[:, None] & d_ok[None, :]
    k = tl.load(base + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(base + stride_ckv + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def kv_full_tile(
    base,
    table_row_ptr,
    pos,
    offs_d,
    d_ok,
    stride_cb,
    stride_co,
    stride_ckv,
    BLOCK_SIZE: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """kv_tile of keys all in range: no key mask, nor a head-dim one when head_dim is its padding."""
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE)
    ptrs = (
        base
        + (block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_co)[:, None]
        + offs_d[None, :]
    )
    if EVEN_D:
        k = tl.load(ptrs)
        v = tl.load(ptrs + stride_ckv)
    else:
        k = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
        v = tl.load(ptrs + stride_ckv, mask=d_ok[None, :], other=0.0)
    return k, v


@triton.jit
def softmax_step(
    q, k, v, allowed, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr, MASKED: tl.constexpr
):
    """One key tile of the online softmax in float32: scores q k^T in log2 units (qk_scale: the
    softmax scale times LOG2E; with MASKED only `allowed` [M, N] count), running max m_i, sum l_i
    and unnormalised output acc updated."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
    if MASKED:
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = m_new
    if MASKED:  # (a row none of whose keys count so far)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc


@triton.jit
def merge_slices(part_ptr, ml_ptr, first, working, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr):
    """The general paged kernel's split-K merge: one (tile, head)'s output from its first `working`
    slices' partials (slots first, first + 1, ...): sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M),
    M the rows' overall max (log2 units)."""
    offs_d = tl.arange(0, D_PAD)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    for s in range(working):
        slot = (first + s) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_s = tl.load(ml_ptr + slot * 2)
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a_old, a_s = tl.exp2(m_i - m_safe), tl.exp2(m_s - m_safe)
        l_i = l_i * a_old + tl.load(ml_ptr + slot * 2 + 1) * a_s
        acc = (
            acc * a_old[:, None]
            + tl.load(part_ptr + slot[:, None] * D_PAD + offs_d[None, :]) * a_s[:, None]
        )
        m_i = m_new
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


@triton.jit
def paged_item(
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
        # keys before the tile's first row are every row's: whole tiles without masks, then the rest
        free = tl.minimum(hi, tl.maximum(lo, (q0 + r0) // BLOCK_N * BLOCK_N))
        for n0 in range(lo, free, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            k, v = kv_full_tile(
                base,
                table,
                pos,
                offs_d,
                d_ok,
                stride_cb,
                stride_co,
                stride_ckv,
                BLOCK_SIZE,
                HEAD_DIM == D_PAD,
            )
            m_i, l_i, acc = softmax_step(q, k, v, None, m_i, l_i, acc, scale, IEEE, False)
        for n0 in range(free, hi, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            key_ok = pos < hi
            k, v = kv_tile(
                base, table, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE
            )
            m_i, l_i, acc = softmax_step(
                q,
                k,
                v,
                (pos[None, :] <= q_pos[:, None]) & key_ok[None, :],
                m_i,
                l_i,
                acc,
                scale,
                IEEE,
                True,
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
            # the split-K handshake (a CTA barrier, one gpu-scope acq_rel atomic): the last arrival
            # merges
            tl.debug_barrier()
            if tl.atomic_add(count_ptr + pair, 1, sem="acq_rel") == working - 1:
                out = merge_slices(part_ptr, ml_ptr, pair * splits, working, BLOCK_M, D_PAD)
                tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(count_ptr + pair, 0)
        else:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=o_mask)


@functools.cache
def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
