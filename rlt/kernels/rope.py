"""RoPE in place on q and k together, one Triton launch (instead of ~10 torch ops per tensor):
rotate-half (Llama/Qwen2) or adjacent pairs (Huginn), angles computed in float32 from the
positions. With a KV cache the same launch also stores the rotated k and v into their slots (the
attention of a pass needs no separate KV-write launch). The torch functions in
rlt/models/layers.py and rlt/kernels/paged_attention.write_kv are the reference."""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


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
    HEADS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (t, g): heads g * HEADS .. of token t, counted q heads first, then k heads, then (with
    WRITE_KV) v heads: q and k rotated in place, k (rotated) and v stored into the slot with
    WRITE_KV. BIAS: q and k first get their per-head bias (Huginn's qk_bias, [heads, D] each), rounded
    to their dtype as the separate add would. A block of heads per program shares the angles and keeps
    a long prompt's launch to a few programs per token."""
    t = tl.program_id(0)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
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
        dst = (
            cache_ptr
            + (slot // BLOCK_SIZE) * stride_cb
            + layer * stride_cl
            + (slot % BLOCK_SIZE) * stride_co
            + (which * stride_ckv + kv_head * stride_ch)[:, None]
        )
        tl.store(dst + ia, ra, mask=is_k | is_v)
        tl.store(dst + ib, rb, mask=is_k | is_v)


HEADS = 16  # heads per program over many rows (a prompt's)
FEW_ROWS = 256  # up to this many rows (decode passes), a program per head: more programs, shorter chains


def _launch(q, k, v, positions, inv_freq, pairs, cache, layer, slots, block_size, q_bias=None, k_bias=None):
    T, H, D = q.shape
    Hkv = k.shape[1]
    if not T:
        return
    half = D // 2
    write = cache is not None
    c = cache if write else q  # (unused without WRITE_KV)
    v = v if write else k
    cs = cache.stride() if write else (0,) * 6
    heads = 1 if T <= FEW_ROWS else min(HEADS, triton.next_power_of_2(H + (2 if write else 1) * Hkv))
    pdl.launch(
        _rope_kernel,
        (T, triton.cdiv(H + (2 if write else 1) * Hkv, heads)),
        q,
        k,
        v,
        positions,
        inv_freq,
        q if q_bias is None else q_bias,  # (unused without BIAS)
        k if k_bias is None else k_bias,
        c,
        slots if write else positions,
        layer,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cs[0],
        cs[1],
        cs[2],
        cs[3],
        cs[4],
        HQ=H,
        HKV=Hkv,
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        PAIRS=pairs,
        BIAS=q_bias is not None,
        WRITE_KV=write,
        BLOCK_SIZE=block_size,
        HEADS=heads,
        like=q,
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
