"""RoPE in place on q and k together, one Triton launch (instead of ~10 torch ops per tensor):
rotate-half (Llama/Qwen2) or adjacent pairs (Huginn), angles computed in float32 from the
positions. With a KV cache the same launch also stores the rotated k and v into their slots (the
attention of a pass needs no separate KV-write launch). The torch functions in
rlt/models/layers.py and rlt/kernels/paged_attention.write_kv are the reference."""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@triton.jit
def slot_offset(slot, layer, stride_cb, stride_cl, stride_co, BLOCK_SIZE: tl.constexpr):
    """Where a flat slot's position (its block, its row in the block) starts at this layer of cache
    [blocks, layers, 2, block_size, Hkv, D], in elements."""
    return (slot // BLOCK_SIZE) * stride_cb + layer * stride_cl + (slot % BLOCK_SIZE) * stride_co


# One variant for every layer index (see _paged_attn_kernel).
@triton.jit(do_not_specialize=["layer"])
def _rope_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    inv_ptr,
    q_bias_ptr,
    k_bias_ptr,
    cache_ptr,
    slot_ptr,
    layer,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cl,
    stride_ckv,
    stride_co,
    stride_ch,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAIRS: tl.constexpr,
    BIAS: tl.constexpr,
    WRITE_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (t, h): head h of token t, counted q heads first, then k heads, then (with WRITE_KV) v
    heads: q and k rotated in place, k (rotated) and v stored into the slot with WRITE_KV. BIAS: q
    and k first get their per-head bias (Huginn's qk_bias, [heads, D] each), rounded to their dtype
    as the separate add would. A program per head: a decode pass's few rows in many short programs."""
    t = tl.program_id(0)
    h = tl.program_id(1) + tl.arange(0, 1)
    j = tl.arange(0, HALF_PAD)
    ok = (j < HALF)[None, :]
    if PAIRS:  # (x[2j], x[2j+1]) as a complex number
        ia, ib = 2 * j[None, :], 2 * j[None, :] + 1
    else:  # (x[j], x[j + D/2])
        ia, ib = j[None, :], j[None, :] + HALF
    # Before the PDL wait: the angles (positions and the K/V slots are written before a pass's first
    # kernel starts, inv_freq never), so after it only q/k/v are read.
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_ptr + j, mask=j < HALF, other=0.0)
    c, s = tl.cos(angle)[None, :], tl.sin(angle)[None, :]
    if WRITE_KV:
        slot = tl.load(slot_ptr + t)
    pdl.begin(PDL)
    is_q = (h < HQ)[:, None] & ok
    is_k = ((h >= HQ) & (h < HQ + HKV))[:, None] & ok
    is_v = ((h >= HQ + HKV) & (h < HQ + 2 * HKV))[:, None] & ok
    q_at = q_ptr + t * stride_qt + h[:, None] * stride_qh
    k_at = k_ptr + t * stride_kt + (h[:, None] - HQ) * stride_kh
    # (one of the three loads is live per head: the others read as 0)
    qa, qb = tl.load(q_at + ia, mask=is_q, other=0.0), tl.load(q_at + ib, mask=is_q, other=0.0)
    ka, kb = tl.load(k_at + ia, mask=is_k, other=0.0), tl.load(k_at + ib, mask=is_k, other=0.0)
    if BIAS:
        q_b = q_bias_ptr + h[:, None] * (2 * HALF)
        k_b = k_bias_ptr + (h[:, None] - HQ) * (2 * HALF)
        qa += tl.load(q_b + ia, mask=is_q, other=0.0)
        qb += tl.load(q_b + ib, mask=is_q, other=0.0)
        ka += tl.load(k_b + ia, mask=is_k, other=0.0)
        kb += tl.load(k_b + ib, mask=is_k, other=0.0)
    a = qa.to(tl.float32) + ka.to(tl.float32)
    b = qb.to(tl.float32) + kb.to(tl.float32)
    if WRITE_KV:  # v heads: stored as they are
        v_at = v_ptr + t * stride_vt + (h[:, None] - HQ - HKV) * stride_vh
        a += tl.load(v_at + ia, mask=is_v, other=0.0).to(tl.float32)
        b += tl.load(v_at + ib, mask=is_v, other=0.0).to(tl.float32)
    ra = tl.where(is_v, a, a * c - b * s).to(q_ptr.dtype.element_ty)
    rb = tl.where(is_v, b, b * c + a * s).to(q_ptr.dtype.element_ty)
    tl.store(q_at + ia, ra, mask=is_q)
    tl.store(q_at + ib, rb, mask=is_q)
    tl.store(k_at + ia, ra, mask=is_k)
    tl.store(k_at + ib, rb, mask=is_k)
    if WRITE_KV:
        which = (h >= HQ + HKV).to(tl.int32)  # 0: K, 1: V
        kv_head = h - HQ - which * HKV
        at = slot_offset(slot, layer, stride_cb, stride_cl, stride_co, BLOCK_SIZE)
        dst = cache_ptr + at + (which * stride_ckv + kv_head * stride_ch)[:, None]
        tl.store(dst + ia, ra, mask=is_k | is_v)
        tl.store(dst + ib, rb, mask=is_k | is_v)


@triton.jit
def _rotate_heads(
    x_ptr, bias_ptr, stride_t, stride_h, t, ok_t, ia, ib, ok_j, c, s, H, H_PAD, D, BIAS
):
    """Every head of x at tokens t ([BLOCK_T, H_PAD, HALF_PAD] tiles): biased with BIAS (rounded to
    x's dtype, as the separate add), rotated in float32, stored in place; -> (ra, rb, mask)."""
    h = tl.arange(0, H_PAD)[None, :, None]
    at = x_ptr + t[:, None, None] * stride_t + h * stride_h
    m = ok_t[:, None, None] & (h < H) & ok_j
    a, b = tl.load(at + ia, mask=m, other=0.0), tl.load(at + ib, mask=m, other=0.0)
    if BIAS:
        a += tl.load(bias_ptr + h * D + ia, mask=(h < H) & ok_j, other=0.0)
        b += tl.load(bias_ptr + h * D + ib, mask=(h < H) & ok_j, other=0.0)
    a, b = a.to(tl.float32), b.to(tl.float32)
    ra, rb = (a * c - b * s).to(x_ptr.dtype.element_ty), (b * c + a * s).to(x_ptr.dtype.element_ty)
    tl.store(at + ia, ra, mask=m)
    tl.store(at + ib, rb, mask=m)
    return ra, rb, m


@triton.jit(do_not_specialize=["layer"])
def _rope_tokens_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    inv_ptr,
    q_bias_ptr,
    k_bias_ptr,
    cache_ptr,
    slot_ptr,
    T,
    layer,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cl,
    stride_ckv,
    stride_co,
    stride_ch,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HKV_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAIRS: tl.constexpr,
    BIAS: tl.constexpr,
    WRITE_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program p: tokens p * BLOCK_T .., every head of q, k (and v with WRITE_KV) as dense tiles, the
    same arithmetic as _rope_kernel (bit-equal). Over a prompt's rows it moves the bytes at 0.71-0.84 of
    a copy's pace, where a program per token and head would take several times as many programs."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok_t = t < T
    j = tl.arange(0, HALF_PAD)
    ok_j = (j < HALF)[None, None, :]
    if PAIRS:
        ia, ib = (2 * j)[None, None, :], (2 * j + 1)[None, None, :]
    else:
        ia, ib = j[None, None, :], (j + HALF)[None, None, :]
    # Before the PDL wait, as _rope_kernel: the angles and slots only.
    pos = tl.load(pos_ptr + t, mask=ok_t, other=0).to(tl.float32)
    angle = pos[:, None] * tl.load(inv_ptr + j, mask=j < HALF, other=0.0)[None, :]
    c, s = tl.cos(angle)[:, None, :], tl.sin(angle)[:, None, :]
    if WRITE_KV:
        slot = tl.load(slot_ptr + t, mask=ok_t, other=0)
    pdl.begin(PDL)
    _rotate_heads(
        q_ptr,
        q_bias_ptr,
        stride_qt,
        stride_qh,
        t,
        ok_t,
        ia,
        ib,
        ok_j,
        c,
        s,
        HQ,
        HQ_PAD,
        2 * HALF,
        BIAS,
    )
    ka, kb, m = _rotate_heads(
        k_ptr,
        k_bias_ptr,
        stride_kt,
        stride_kh,
        t,
        ok_t,
        ia,
        ib,
        ok_j,
        c,
        s,
        HKV,
        HKV_PAD,
        2 * HALF,
        BIAS,
    )
    if WRITE_KV:
        h = tl.arange(0, HKV_PAD)[None, :, None]
        row = slot_offset(slot, layer, stride_cb, stride_cl, stride_co, BLOCK_SIZE)
        dst = cache_ptr + row[:, None, None] + h * stride_ch
        tl.store(dst + ia, ka, mask=m)
        tl.store(dst + ib, kb, mask=m)
        v_at = v_ptr + t[:, None, None] * stride_vt + h * stride_vh
        tl.store(dst + stride_ckv + ia, tl.load(v_at + ia, mask=m, other=0.0), mask=m)
        tl.store(dst + stride_ckv + ib, tl.load(v_at + ib, mask=m, other=0.0), mask=m)


# up to this many rows (decode passes) a program per head: more programs, shorter chains
FEW_ROWS = 256
BLOCK_T = 2  # tokens a program over more rows (timed at Ouro's and Nanbeige's shapes)


def _launch(
    q, k, v, positions, inv_freq, pairs, cache, layer, slots, block_size, q_bias=None, k_bias=None
):
    T, H, D = q.shape
    Hkv = k.shape[1]
    if not T:
        return
    write = cache is not None
    c = cache if write else q  # (unused without WRITE_KV)
    v = v if write else k
    cs = cache.stride() if write else (0,) * 6
    pointers = (
        q,
        k,
        v,
        positions,
        inv_freq,
        q if q_bias is None else q_bias,
        k if k_bias is None else k_bias,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *cs[:5],
    )
    common = dict(
        HQ=H,
        HKV=Hkv,
        HALF=D // 2,
        HALF_PAD=triton.next_power_of_2(D // 2),
        PAIRS=pairs,
        BIAS=q_bias is not None,
        WRITE_KV=write,
        BLOCK_SIZE=block_size,
        like=q,
    )
    slots = slots if write else positions  # (unused without WRITE_KV)
    if T <= FEW_ROWS:
        grid = (T, H + (2 if write else 1) * Hkv)
        pdl.launch(_rope_kernel, grid, *pointers, c, slots, layer, *strides, **common)
        return
    pads = dict(HQ_PAD=triton.next_power_of_2(H), HKV_PAD=triton.next_power_of_2(Hkv))
    grid = (triton.cdiv(T, BLOCK_T),)
    pdl.launch(
        _rope_tokens_kernel,
        grid,
        *pointers,
        c,
        slots,
        T,
        layer,
        *strides,
        BLOCK_T=BLOCK_T,
        **pads,
        **common,
    )


def rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    pairs: bool,
    q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, Hkv, D] (last dim contiguous; views of the projection are fine), biased
    (q_bias [H, D], k_bias [Hkv, D], contiguous) and rotated in place, and returned."""
    _launch(q, k, None, positions, inv_freq, pairs, None, 0, None, 1, q_bias, k_bias)
    return q, k


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    pairs: bool,
    cache: torch.Tensor,
    layer: int,
    slots: torch.Tensor,
    block_size: int,
    q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_ on q and k, and the rotated k and v stored at slots [T] of cache [blocks, layers, 2,
    block_size, Hkv, D] at this layer: one launch. Returns (q, k), rotated in place."""
    _launch(q, k, v, positions, inv_freq, pairs, cache, layer, slots, block_size, q_bias, k_bias)
    return q, k
