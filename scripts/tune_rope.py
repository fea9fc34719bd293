"""RoPE with the K/V store (rlt/kernels/rope.rope_write_kv) at prefill shapes, against the same
bytes copied (q, k, v read; q, k and the cache's k, v written): its two layouts (a program per
token and head, as decode passes take it; past rope.FEW_ROWS rows a program per `block_t` tokens
and every head) over block_t and warps. Each variant is checked against the torch reference, and
bit for bit against the per-head layout.

    python scripts/tune_rope.py [--shapes ouro,nanbeige] [--rows 1024,4096]

On a CPU (TRITON_INTERPRET=1) it only checks the variants, at --rows 5.
"""

import argparse
import os

import torch

from rlt.kernels import rope
from rlt.models import layers

SHAPES = {"ouro": (16, 16, 128), "nanbeige": (48, 8, 128)}  # q heads, kv heads, head dim
BLOCK_SIZE = 16


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
    """(label, fn): the per-head layout first (the others' bits are compared with its)."""

    def variant(few_rows, block_t=rope.BLOCK_T, warps=None):
        def fn(q, k, v, p, i, c, s):
            saved = rope.FEW_ROWS, rope.BLOCK_T, rope.pdl.launch
            warps_ = {} if warps is None else {"num_warps": warps}
            rope.FEW_ROWS, rope.BLOCK_T = few_rows, block_t
            rope.pdl.launch = lambda kernel, grid, *a, **kw: saved[2](kernel, grid, *a, **kw, **warps_)
            try:
                rope.rope_write_kv(q, k, v, p, i, False, c, 1, s, BLOCK_SIZE)
            finally:
                rope.FEW_ROWS, rope.BLOCK_T, rope.pdl.launch = saved

        return fn

    yield "a program per token and head", variant(1 << 30)
    for bt in map(int, args.block_t.split(",")):
        for w in map(int, args.warps.split(",")):
            yield f"tokens block_t={bt} warps={w}", variant(0, bt, w)


def timed(fn) -> float | None:
    """Microseconds a call (median), or None off CUDA."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET"):
        return None
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50) * 1e3


def run_variant(fn, shape, qkv, cache, pos, inv, slots, ref, first):
    """fn on fresh copies: (us, max error against the reference, K/V stored, equal to per head's, outputs)."""
    qkv, cache = qkv.clone(), cache.clone()
    q, k, v = split(qkv, shape)
    fn(q, k, v, pos, inv, cache, slots)
    err = max((q.float() - ref[0].float()).abs().max().item(), (k.float() - ref[1].float()).abs().max().item())
    stored = cache[slots // BLOCK_SIZE, 1, :, slots % BLOCK_SIZE]  # [T, 2, Hkv, D]
    kv_ok = torch.equal(stored[:, 0], k) and torch.equal(stored[:, 1], v)
    outs = (q.clone(), k.clone(), cache.clone())
    same = first is None or all(torch.equal(a, b) for a, b in zip(outs, first))
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
            results, first = [], None
            for label, fn in variants(args):
                us, err, kv_ok, same, outs = run_variant(fn, shape, qkv, cache, pos, inv, slots, ref, first)
                first = first or outs
                results.append((label, us, err, kv_ok, same))
            H, Hkv, D = shape
            moved = T * (H + 2 * Hkv) * D * 2 + T * (H + 3 * Hkv) * D * 2
            dst = torch.empty_like(qkv)
            copy_us = timed(lambda dst=dst, qkv=qkv: dst.copy_(qkv))
            print(f"{name} {T} rows: {moved / 1e6:.1f} MB moved; a copy of q/k/v: {copy_us and f'{copy_us:.2f} us'}")
            for label, us, err, kv_ok, same in sorted(results, key=lambda r: r[1] or 0):
                speed = f"{us:8.2f} us {moved / us / 1e6:5.2f} TB/s" if us else "(not timed)"
                print(f"  {label:28s} {speed}  max err {err:.2e}, K/V stored {kv_ok}, equal to per head's {same}")


if __name__ == "__main__":
    main()
