"""RoPE with the K/V store (rlt/kernels/rope.rope_write_kv) at prefill shapes, against the same
bytes copied (q, k, v read; q, k and the cache's k, v written) and a candidate layout: one program
per `block_t` tokens taking all of their q, k and v heads as dense tiles (today's: one program per
token and group of `heads` heads, each loading q, k and v under masks). Each variant is checked
against the torch reference first (bit for bit against today's kernel).

    python scripts/tune_rope.py [--shapes ouro,nanbeige] [--rows 1024,4096]

On a CPU (TRITON_INTERPRET=1) it only checks the variants, at --rows 5.
"""

import argparse
import os

import torch
import triton
import triton.language as tl

from rlt.kernels import rope
from rlt.models import layers

SHAPES = {"ouro": (16, 16, 128), "nanbeige": (48, 8, 128)}  # q heads, kv heads, head dim
BLOCK_SIZE = 16


@triton.jit
def _rotate(x_ptr, stride_t, stride_h, t, ok_t, H: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr, c, s):
    """x's heads of tokens t (rotate-half): loaded, rotated in float32, rounded; (ra, rb, heads, mask)."""
    h = tl.arange(0, H_PAD)
    j = tl.arange(0, HALF)
    at = x_ptr + t[:, None, None] * stride_t + h[None, :, None] * stride_h + j[None, None, :]
    m = ok_t[:, None, None] & (h < H)[None, :, None]
    a = tl.load(at, mask=m, other=0.0).to(tl.float32)
    b = tl.load(at + HALF, mask=m, other=0.0).to(tl.float32)
    return (a * c - b * s).to(x_ptr.dtype.element_ty), (b * c + a * s).to(x_ptr.dtype.element_ty), at, m


@triton.jit
def _rope_tokens_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    inv_ptr,
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
    BLOCK_T: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Tokens pid * BLOCK_T ..: q and k rotated in place (rotate-half), k and v stored at their slots."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok_t = t < T
    j = tl.arange(0, HALF)
    angle = tl.load(pos_ptr + t, mask=ok_t, other=0).to(tl.float32)[:, None] * tl.load(inv_ptr + j)[None, :]
    c, s = tl.cos(angle)[:, None, :], tl.sin(angle)[:, None, :]
    slot = tl.load(slot_ptr + t, mask=ok_t, other=0)
    row = (slot // BLOCK_SIZE) * stride_cb + layer * stride_cl + (slot % BLOCK_SIZE) * stride_co
    qa, qb, q_at, qm = _rotate(q_ptr, stride_qt, stride_qh, t, ok_t, HQ, HQ_PAD, HALF, c, s)
    tl.store(q_at, qa, mask=qm)
    tl.store(q_at + HALF, qb, mask=qm)
    ka, kb, k_at, km = _rotate(k_ptr, stride_kt, stride_kh, t, ok_t, HKV, HKV_PAD, HALF, c, s)
    tl.store(k_at, ka, mask=km)
    tl.store(k_at + HALF, kb, mask=km)
    h = tl.arange(0, HKV_PAD)
    dst = cache_ptr + row[:, None, None] + h[None, :, None] * stride_ch + j[None, None, :]
    tl.store(dst, ka, mask=km)
    tl.store(dst + HALF, kb, mask=km)
    v_at = v_ptr + t[:, None, None] * stride_vt + h[None, :, None] * stride_vh + j[None, None, :]
    v = tl.load(v_at, mask=km, other=0.0)
    tl.store(dst + stride_ckv, v, mask=km)
    v = tl.load(v_at + HALF, mask=km, other=0.0)
    tl.store(dst + stride_ckv + HALF, v, mask=km)


def rope_tokens(q, k, v, positions, inv_freq, cache, layer, slots, block_t, warps):
    T, H, D = q.shape
    Hkv = k.shape[1]
    cs = cache.stride()
    _rope_tokens_kernel[(triton.cdiv(T, block_t),)](
        q, k, v, positions, inv_freq, cache, slots, T, layer, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), cs[0], cs[1], cs[2], cs[3], cs[4], HQ=H, HKV=Hkv,
        HQ_PAD=triton.next_power_of_2(H), HKV_PAD=triton.next_power_of_2(Hkv), HALF=D // 2, BLOCK_T=block_t,
        BLOCK_SIZE=BLOCK_SIZE, num_warps=warps,
    )  # fmt: skip


def split(qkv, shape):
    """q [T, H, D], k and v [T, Hkv, D]: views of the projection's output, as the model's."""
    H, Hkv, D = shape
    return (t.view(len(qkv), h, D) for t, h in zip(qkv.split([H * D, Hkv * D, Hkv * D], dim=1), (H, Hkv, Hkv)))


def inputs(shape, T, dev):
    H, Hkv, D = shape
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, device=dev, generator=g).to(torch.bfloat16)
    blocks = -(-T // BLOCK_SIZE) + 1
    cache = torch.zeros(blocks, 2, 2, BLOCK_SIZE, Hkv, D, device=dev, dtype=torch.bfloat16)
    used = -(-T // BLOCK_SIZE)
    starts = torch.randperm(blocks, device=dev, generator=g)[:used].repeat_interleave(BLOCK_SIZE) * BLOCK_SIZE
    slots = (starts + torch.arange(BLOCK_SIZE, device=dev).repeat(used))[:T]
    pos = torch.arange(T, device=dev) + 7
    inv = layers.rope_inv_freq(D, 1e6).to(dev)
    return qkv, pos, inv, cache, slots


def variants(args):
    yield "today", lambda q, k, v, p, i, c, s: rope.rope_write_kv(q, k, v, p, i, False, c, 1, s, BLOCK_SIZE)
    for bt in map(int, args.block_t.split(",")):
        for w in map(int, args.warps.split(",")):
            yield (
                f"tokens block_t={bt} warps={w}",
                (lambda q, k, v, p, i, c, s, bt=bt, w=w: rope_tokens(q, k, v, p, i, c, 1, s, bt, w)),
            )


def timed(fn) -> float | None:
    """Microseconds a call (median), or None off CUDA."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET"):
        return None
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50) * 1e3


def run_variant(fn, shape, qkv, cache, pos, inv, slots, ref, today):
    """fn on fresh copies: (us, max error against the reference, K/V stored, equal to today's, outputs)."""
    qkv, cache = qkv.clone(), cache.clone()
    q, k, v = split(qkv, shape)
    fn(q, k, v, pos, inv, cache, slots)
    err = max((q.float() - ref[0].float()).abs().max().item(), (k.float() - ref[1].float()).abs().max().item())
    stored = cache[slots // BLOCK_SIZE, 1, :, slots % BLOCK_SIZE]  # [T, 2, Hkv, D]
    kv_ok = torch.equal(stored[:, 0], k) and torch.equal(stored[:, 1], v)
    outs = (q.clone(), k.clone(), cache.clone())
    same = today is None or all(torch.equal(a, b) for a, b in zip(outs, today))
    us = timed(lambda: fn(q, k, v, pos, inv, cache, slots))
    return us, err, kv_ok, same, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="ouro,nanbeige")
    ap.add_argument("--rows", default=None, help="default: 1024,4096 (CUDA), 5 (CPU)")
    ap.add_argument("--block-t", default="1,2,4")
    ap.add_argument("--warps", default="2,4,8")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
    rows = args.rows or ("1024,4096" if dev == "cuda" else "5")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for T in map(int, rows.split(",")):
            qkv, pos, inv, cache, slots = inputs(shape, T, dev)
            q, k, _ = split(qkv, shape)
            ref = layers.rope(q, k, pos, inv, False)
            results, today = [], None
            for label, fn in variants(args):
                us, err, kv_ok, same, outs = run_variant(fn, shape, qkv, cache, pos, inv, slots, ref, today)
                today = today or outs
                results.append((label, us, err, kv_ok, same))
            H, Hkv, D = shape
            moved = T * (H + 2 * Hkv) * D * 2 + T * (H + 3 * Hkv) * D * 2
            dst = torch.empty_like(qkv)
            copy_us = timed(lambda dst=dst, qkv=qkv: dst.copy_(qkv))
            print(f"{name} {T} rows: {moved / 1e6:.1f} MB moved; a copy of q/k/v: {copy_us and f'{copy_us:.2f} us'}")
            for label, us, err, kv_ok, same in sorted(results, key=lambda r: r[1] or 0):
                speed = f"{us:8.2f} us {moved / us / 1e6:5.2f} TB/s" if us else "(not timed)"
                print(f"  {label:28s} {speed}  max err {err:.2e}, K/V stored {kv_ok}, equal to today's {same}")


if __name__ == "__main__":
    main()
