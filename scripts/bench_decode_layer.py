"""Where a concurrency-1 decode layer's attention time goes (Ouro-1.4B shapes by default): the
q/k/v GEMV, RoPE with the K/V store, and the decode attention over a 1K context, timed in CUDA
graphs of 24 layers' worth (PDL on, as in the engine):

- gemv: the q/k/v products alone; attention: the attention alone (RoPE + store, then attention);
- engine: the three in sequence, as a layer runs them;
- capped C: the same with the q/k/v product run by C programs per SM that loop over its row blocks,
  leaving room on every SM for the attention's programs to become resident (and read their keys)
  while the product still runs; the engine's GEMV has ~6 resident per SM and two waves.

Prints microseconds per layer and what the attention adds after the product.

    python scripts/bench_decode_layer.py [--ctx 1088] [--caps 2,3,4]
"""

import argparse

import torch
import triton
import triton.language as tl

from rlt.bench import floors
from rlt.kernels import gemv, pdl
from rlt.kernels.decode_attention import decode_attention
from rlt.kernels.rope import rope_write_kv
from rlt.models import layers


@triton.jit
def _capped_gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """y = x @ w.T, row blocks shared out over the launch's programs (a grid smaller than the blocks)."""
    offs_k = tl.arange(0, BLOCK_K)
    pdl.begin(PDL)
    for item in range(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        rows = item * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=(rows < N)[:, None] & (kk < K)[None, :])
            acc += w.to(tl.float32) * tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=rows < N)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1088)
    ap.add_argument("--caps", default="2,3,4")
    args = ap.parse_args()
    dev, bs, D, L = "cuda", 16, 128, args.layers
    H, Hkv = args.heads, args.kv_heads
    torch.manual_seed(0)
    ws = [torch.randn((H + 2 * Hkv) * D, args.hidden, device=dev, dtype=torch.bfloat16) / 45 for _ in range(L)]
    nb = -(-args.ctx // bs)
    cache = torch.randn(nb + 1, L, 2, bs, Hkv, D, device=dev, dtype=torch.bfloat16)
    table = torch.randperm(nb, device=dev).view(1, nb)
    pos = torch.tensor([args.ctx - 1], device=dev)
    slot = table[0, -1:] * bs + (args.ctx - 1) % bs
    inv = layers.rope_inv_freq(D, 1e6).to(dev)
    x = torch.randn(1, args.hidden, device=dev, dtype=torch.bfloat16)
    qkv_out = torch.empty(1, (H + 2 * Hkv) * D, device=dev, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def split(y):
        return layers.split_qkv(y, H, Hkv, D)

    def attend(i, y):
        q, k, v = split(y)
        rope_write_kv(q, k, v, pos, inv, False, cache, i, slot, bs)
        return decode_attention(cache, i, q, table, pos, bs)

    def capped(w, cap):
        N, K = w.shape
        cfg = gemv.CONFIG
        pdl.launch(
            _capped_gemv_kernel,
            (min(cap * sms, triton.cdiv(N, cfg.rows)),),
            x,
            w,
            qkv_out,
            N,
            K,
            BLOCK_N=cfg.rows,
            BLOCK_K=cfg.k,
            num_warps=cfg.warps,
            like=x,
        )
        return qkv_out

    y0 = gemv.gemv(x, ws[0])

    def engine(product):  # each layer: its q/k/v product, then RoPE + store and attention
        return lambda: [attend(i, product(w)) for i, w in enumerate(ws)]

    rows = [
        ("gemv", floors.graph_us(lambda: [gemv.gemv(x, w) for w in ws], L)),
        ("attention (RoPE + store, attention)", floors.graph_us(lambda: [attend(i, y0) for i in range(L)], L)),
        ("engine: gemv, RoPE + store, attention", floors.graph_us(engine(lambda w: gemv.gemv(x, w)), L)),
    ]
    for cap in (int(c) for c in args.caps.split(",")):
        rows.append((f"capped {cap}/SM gemv alone", floors.graph_us(lambda cap=cap: [capped(w, cap) for w in ws], L)))
        then = floors.graph_us(engine(lambda w, c=cap: capped(w, c)), L)
        rows.append((f"capped {cap}/SM gemv, RoPE + store, attention", then))
    kv_mb = args.ctx * Hkv * D * 2 * 2 / 1e6
    print(f"per layer: q/k/v weights {ws[0].numel() * 2 / 1e6:.1f} MB, KV {kv_mb:.1f} MB at a {args.ctx}-token context")
    for name, us in rows:
        print(f"{name:<48} {us:8.2f} us")


if __name__ == "__main__":
    main()
