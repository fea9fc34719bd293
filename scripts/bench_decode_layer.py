"""Where a concurrency-1 decode layer's attention half spends its time (Ouro-1.4B shapes by default),
launched as the engine launches it (PDL on) in a CUDA graph of every layer: the q/k/v GEMV with RoPE
and the K/V store as its epilogue, the decode attention (its key slices, then their merge), the o
projection's GEMV and the residual add + RMSNorm. For each decode-attention choice (key slices, key
tile, warps; a 0 field takes the engine's choice) it prints microseconds per layer; for the first,
each kernel's mean start and end within a layer (µs after the layer's first kernel starts) and the
busy time it adds past the kernels started before it (rlt/bench/profile.py), against the bytes it
reads at the copy rate.

    python scripts/bench_decode_layer.py [--ctx 1088] [--attention 0,0,4 16,64,4 ...]

--device cpu (under TRITON_INTERPRET=1) runs each choice once, small, and prints its largest
difference from the planned one: the script's own check.
"""

import argparse

import torch

from rlt.bench import floors
from rlt.bench.profile import attribute_busy, traced_kernels
from rlt.kernels import gemv, norm
from rlt.kernels.decode_attention import decode_attention
from rlt.kernels.qkv_rope import qkv_rope_write_kv
from rlt.models import layers


def layer_timeline(fn, n_layers: int, reps: int = 5) -> list[tuple[str, float, float, float]]:
    """fn (one call runs n_layers layers) in a CUDA graph, replayed under torch.profiler -> per kernel
    of a layer (in launch order): (name, mean start, mean end, busy µs it adds), over the middle layers."""
    from torch.profiler import ProfilerActivity, profile

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    ks = traced_kernels(prof)  # (label, start, end) in launch order
    per = len(ks) // (reps * n_layers)
    names = [label.split(" [")[0].split("::")[-1] for label, _, _ in ks[:per]]
    middle = [r * n_layers + i for r in range(reps) for i in range(n_layers // 4, n_layers - n_layers // 4)]
    start, end = [0.0] * per, [0.0] * per
    for layer in middle:
        t0 = ks[layer * per][1]
        for j in range(per):
            _, a, b = ks[layer * per + j]
            start[j] += (a - t0) / len(middle)
            end[j] += (b - t0) / len(middle)
    adds = attribute_busy([(str(i % per), a, b) for i, (_, a, b) in enumerate(ks)])
    return [(names[j], start[j], end[j], adds.get(str(j), 0.0) / (reps * n_layers)) for j in range(per)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1088)
    ap.add_argument("--attention", nargs="*", default=["0,0,4", "16,64,4", "64,32,4"], help="splits,block_n,warps")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dev, bs, D = args.device, 16, 128
    L, hid, H, Hkv, ctx = (
        (args.layers, args.hidden, args.heads, args.kv_heads, args.ctx) if cuda else (2, 64, 4, 2, 100)
    )
    torch.manual_seed(0)
    dt = torch.bfloat16 if cuda else torch.float32
    w_qkv = [torch.randn((H + 2 * Hkv) * D, hid, device=dev, dtype=dt) / hid**0.5 for _ in range(L)]
    w_o = [torch.randn(hid, H * D, device=dev, dtype=dt) / (H * D) ** 0.5 for _ in range(L)]
    n_w = [1 + 0.1 * torch.randn(hid, device=dev, dtype=dt) for _ in range(L)]
    nb = -(-ctx // bs)
    cache = torch.randn(nb + 1, L, 2, bs, Hkv, D, device=dev, dtype=dt)
    table = torch.randperm(nb, device=dev).view(1, nb)
    pos = torch.tensor([ctx - 1], device=dev)
    slot = table[0, -1:] * bs + (ctx - 1) % bs
    inv = layers.rope_inv_freq(D, 1e6).to(dev)
    x0, r0 = torch.randn(1, hid, device=dev, dtype=dt), torch.randn(1, hid, device=dev, dtype=dt)

    def layers_of(splits: int, block_n: int, warps: int):
        def run():
            x, r = x0, r0
            for i in range(L):
                q = qkv_rope_write_kv(x, w_qkv[i], (H, Hkv, D), pos, inv, cache, i, slot, bs)
                a = decode_attention(cache, i, q, table, pos, bs, splits or None, block_n or None, warps)
                o = gemv.gemv(a.view(1, -1), w_o[i], early_tiles=gemv.NORMED_EARLY_TILES)
                r, x = norm.add_rms_norm(r, o, n_w[i], n_w[i], 1e-6)
            return x

        return run

    choices = [tuple(map(int, c.split(","))) for c in args.attention]
    if not cuda:  # (the interpreter has no SM count to plan by: 4 slices stand for the plan)
        ref = layers_of(4, 0, 4)()
        for c in choices:
            print(c, (layers_of(*(c if c[0] else (4, *c[1:])))() - ref).abs().max().item())
        return
    rate = floors.ceilings("cuda")["copy_gbps"] * 1e3  # bytes per µs
    kv = ctx * Hkv * D * 2 * cache.element_size()
    print(
        f"{L} layers, {ctx} keys: q/k/v {w_qkv[0].numel() * 2 / 1e6:.1f} MB, KV {kv / 1e6:.1f} MB, o "
        f"{w_o[0].numel() * 2 / 1e6:.1f} MB a layer; copy rate {rate / 1e6:.2f} TB/s"
    )
    for n, c in enumerate(choices):
        run = layers_of(*c)
        print(
            f"attention splits {c[0] or 'planned'}, key tile {c[1] or 'default'}, warps {c[2]}: "
            f"{floors.graph_us(run, L):.2f} µs a layer"
        )
        if n == 0:
            reads = {"_qkv_rope_kernel": [w_qkv[0].numel() * 2], "_gemv_kernel": [w_o[0].numel() * 2]}
            reads["_decode_kernel"] = [kv]
            for name, a, b, adds in layer_timeline(run, L):
                bytes_read = reads.get(name)
                floor = bytes_read.pop(0) / rate if bytes_read else 0.0
                print(f"  {name:<24} start {a:6.2f} end {b:6.2f} µs, adds {adds:6.2f} (its bytes {floor:5.2f})")


if __name__ == "__main__":
    main()
