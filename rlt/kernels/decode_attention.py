"""Paged decode attention in Triton: passes where every segment is one query row (decode tokens).

One program per (row, KV head, key slice) serves every query head of its GQA group, so each K/V
block is read once per row, not once per query head: the group's heads are the rows of a
tensor-core tile (padded to 16; MHA uses one of them). Small passes split the keys
(flash-decoding) into slices that fill the GPU, and a second launch merges them, a program per
(row, query head): with PDL its programs are resident before the slices finish, and that kernel
boundary measured cheaper than the last slice to finish merging behind an arrival counter (a
fence and an atomic round trip before its reads). Slices past a row's keys exit at once, before
the PDL wait, and the merge counts only the working ones. RoPE and the new K/V store run in the
launch before (rlt/kernels/rope.py; at one row the q/k/v product's epilogue, rlt/kernels/qkv_rope.py):
fused here they make the pass slower. Tested against rlt/kernels/paged_attention.py's reference
(the general Triton kernel keeps prompt chunks and batch-invariant mode).
"""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.attention_steps import LOG2E, kv_tile, num_sms, softmax_step

BLOCK_N = 64  # key tile of unsplit passes
SPLIT_BLOCK_N = 32  # key tile of split passes (their key slices are short)
MAX_SPLITS = 32
MERGE_WARPS = 4


def plan_splits(rows: int, kv_heads: int, device: torch.device) -> int:
    """Key slices per (row, KV head) when the pass has fewer (row, KV head) programs than SMs (1
    otherwise): a power of two giving two to four programs per SM, at most MAX_SPLITS."""
    programs, sms = rows * kv_heads, num_sms(device)
    if programs >= sms:
        return 1
    return min(MAX_SPLITS, 1 << (2 * sms // programs).bit_length())


@triton.jit
def _slice_len(kv_len, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """Keys per slice: whole tiles, the row's tiles shared out over SPLITS (the last ones may hold none)."""
    return tl.cdiv(tl.cdiv(kv_len, BLOCK_N), SPLITS) * BLOCK_N


# One variant for every layer index and table width (see _paged_attn_kernel).
@triton.jit(do_not_specialize=["layer", "stride_ts"])
def _decode_kernel(
    q_ptr,
    o_ptr,
    part_ptr,
    ml_ptr,
    cache_ptr,
    table_ptr,
    pos_ptr,
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
    H: tl.constexpr,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    kv_len = tl.load(pos_ptr + row) + 1  # keys 0..position (the row's own K/V is written)
    chunk = _slice_len(kv_len, BLOCK_N, SPLITS)
    lo = split * chunk
    # a slice past the row's keys (slices are whole tiles; shorter rows leave more):
    if lo >= kv_len:
        return  # no work, nothing to merge — the merge counts the working slices only
    hi = tl.minimum(lo + chunk, kv_len)
    base = cache_ptr + layer * stride_cl + kv_head * stride_ch
    tab = table_ptr + row * stride_ts
    if SPLITS > 1:
        # A split pass is short (a tile or two per program): its first key tile is read before
        # waiting on the previous kernel (PDL), all but the newest key, which that kernel (the K/V
        # store) writes; every other key of the plane, the position and the block table were
        # written before it. (Unsplit passes keep a plain loop, which Triton pipelines.)
        pos = lo + tl.arange(0, BLOCK_N)
        k, v = kv_tile(
            base,
            tab,
            pos,
            pos < tl.minimum(hi, kv_len - 1),
            offs_d,
            d_ok,
            stride_cb,
            stride_co,
            stride_ckv,
            BLOCK_SIZE,
        )
    pdl.begin(PDL)
    head0 = kv_head * GROUP
    offs_g = tl.arange(0, G_PAD)
    g_ok = offs_g < GROUP
    heads = head0 + offs_g
    q = tl.load(
        q_ptr + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), tl.float32)
    start = lo
    if SPLITS > 1:
        if lo + BLOCK_N >= kv_len:  # the first tile holds the newest key: read it now
            k, v = kv_tile(
                base, tab, pos, pos < hi, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE
            )
        m_i, l_i, acc = softmax_step(q, k, v, (pos < hi)[None, :], m_i, l_i, acc, scale, IEEE, True)
        start = lo + BLOCK_N
    for n0 in range(start, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < hi
        k, v = kv_tile(
            base, tab, pos, key_ok, offs_d, d_ok, stride_cb, stride_co, stride_ckv, BLOCK_SIZE
        )
        m_i, l_i, acc = softmax_step(q, k, v, key_ok[None, :], m_i, l_i, acc, scale, IEEE, True)
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            o_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )
    else:
        slot = (row * H + heads) * SPLITS + split
        tl.store(part_ptr + slot[:, None] * D_PAD + offs_d[None, :], acc, mask=g_ok[:, None])
        tl.store(ml_ptr + slot * 2, m_i, mask=g_ok)
        tl.store(ml_ptr + slot * 2 + 1, l_i, mask=g_ok)


@triton.jit
def _merge_kernel(
    o_ptr,
    part_ptr,
    ml_ptr,
    pos_ptr,
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (row, head): out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M) (log2 units) over
    the row's slices that held keys (the first ones; the others stored nothing)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    # (positions are written before the pass: read before the wait)
    kv_len = tl.load(pos_ptr + row) + 1
    working = tl.cdiv(kv_len, _slice_len(kv_len, BLOCK_N, SPLITS))
    pdl.begin(PDL)
    s = tl.arange(0, SPLITS)
    ok = s < working
    slots = (row * H + head) * SPLITS + s
    m = tl.load(ml_ptr + slots * 2, mask=ok, other=float("-inf"))
    l = tl.load(ml_ptr + slots * 2 + 1, mask=ok, other=0.0)
    offs_d = tl.arange(0, D_PAD)
    acc = tl.load(part_ptr + slots[:, None] * D_PAD + offs_d[None, :], mask=ok[:, None], other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    l_tot = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(l_tot == 0.0, 1.0, l_tot)
    tl.store(
        o_ptr + row * stride_ot + head * stride_oh + offs_d,
        out.to(o_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def decode_attention(
    cache: torch.Tensor,
    layer: int,
    q: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    maxnreg: int | None = None,
) -> torch.Tensor:
    """q [R, H, D] (last dim contiguous, rotated): one query row per segment at positions [R], row r's
    keys (its own K/V already stored) in block_table[r]; cache [blocks, layers, 2, block_size, Hkv, D]
    -> [R, H, D]. splits: key slices per (row, KV head); None: plan_splits. block_n (None: by
    splits), num_warps and maxnreg (a register cap for split passes; None: none) are for tuning."""
    R, H, D = q.shape
    Hkv = cache.shape[4]
    group = H // Hkv
    assert q.stride(-1) == 1, "q needs a contiguous last dimension"
    if splits is None:
        splits = plan_splits(R, Hkv, q.device)
    if block_n is None:
        block_n = BLOCK_N if splits == 1 else SPLIT_BLOCK_N
    out = torch.empty(R, H, D, dtype=q.dtype, device=q.device)
    d_pad = max(16, triton.next_power_of_2(D))
    g_pad = max(16, triton.next_power_of_2(group))  # tl.dot needs 16 rows
    n_part = R * H * splits if splits > 1 else 1
    part = torch.empty(n_part, d_pad, dtype=torch.float32, device=q.device)
    ml = torch.empty(2 * n_part, dtype=torch.float32, device=q.device)
    pdl.launch(
        _decode_kernel,
        (R, Hkv, splits),
        q,
        out,
        part,
        ml,
        cache,
        block_table,
        positions,
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
        H=H,
        GROUP=group,
        G_PAD=g_pad,
        BLOCK_SIZE=block_size,
        HEAD_DIM=D,
        D_PAD=d_pad,
        BLOCK_N=block_n,
        SPLITS=splits,
        IEEE=q.dtype == torch.float32,
        num_warps=num_warps,
        like=q,
        **_register_cap(maxnreg, splits, q),
    )
    if splits > 1:
        pdl.launch(
            _merge_kernel,
            (R, H),
            out,
            part,
            ml,
            positions,
            out.stride(0),
            out.stride(1),
            H=H,
            HEAD_DIM=D,
            D_PAD=d_pad,
            BLOCK_N=block_n,
            SPLITS=splits,
            num_warps=MERGE_WARPS,
            like=q,
        )
    return out


def _register_cap(maxnreg: int | None, splits: int, q: torch.Tensor) -> dict:
    """The maxnreg launch option for a split pass on CUDA (the interpreter takes no such option)."""
    return {"maxnreg": maxnreg} if maxnreg and splits > 1 and q.is_cuda else {}
