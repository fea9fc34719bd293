"""Times decode-pass kernels at decode shapes with the L2 flushed before every call (as in a real
pass, where weights and KV come from HBM): the decode attention kernel over key-tile sizes, warps
and key splits, and the one-row GEMM over Triton configs (gemv.CONFIGS, or --configs) against
cuBLAS. Prints the fastest first, and the engine's defaults.

  python scripts/tune_decode.py [--heads 16 --kv-heads 16 --ctx 1088,4128 --rows 1,4] [--configs 2,1024,4 ...]

With --engine MODEL it times the decode attention's (key slices, key tile) choices where they
matter, inside the engine: concurrency-1 decode tok/s of MODEL (1,024-token prompt, fixed depth),
one engine per choice, the kernel's choices set for that engine only (--splits S,N ...).
"""

import argparse
import gc
import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from rlt.kernels import decode_attention as da
from rlt.kernels.gemv import CONFIG, CONFIGS, GemvConfig, gemv


def bench(fn) -> float:
    return do_bench(fn, warmup=5, rep=30, return_mode="median") * 1e3  # us


def engine_sweep(path: str, choices: list[tuple[int, int]], reps: int = 2) -> None:
    """Concurrency-1 decode tok/s of the checkpoint at path for each (splits, key tile) choice."""
    from rlt.bench import offline
    from rlt.workers.engine import LoopEngine

    mc, dtype, model = offline.load(path, "cuda")
    planned, tile = da.plan_splits, da.SPLIT_BLOCK_N
    for splits, block_n in [(None, None), *choices] * reps:
        da.plan_splits = planned if splits is None else (lambda rows, kv_heads, device, s=splits: s)
        da.SPLIT_BLOCK_N = tile if block_n is None else block_n
        engine = LoopEngine(mc, model, offline.engine_config(1, 1024, 4), dtype, "cuda")
        row = offline.decode_run(engine, mc, 1, 1.0, 1024, 128)
        print(f"splits {splits or 'planned'} key tile {block_n or tile}: {row['decode_tok_per_s']} tok/s", flush=True)
        del engine
        gc.collect()  # (an engine in a reference cycle keeps its pool)
        torch.cuda.empty_cache()
    da.plan_splits, da.SPLIT_BLOCK_N = planned, tile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", help="a checkpoint: time the attention choices inside its engine instead")
    ap.add_argument("--splits", nargs="*", default=["16,32", "16,64", "8,64", "8,128", "64,16"])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--ctx", default="1088,4128")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--shapes", default="6144x2048,2048x2048,11264x2048,2048x5632,49152x2048")
    ap.add_argument("--configs", nargs="*", help="GEMV configs rows,k,warps (default: gemv.CONFIGS)")
    args = ap.parse_args()
    if args.engine:
        return engine_sweep(args.engine, [tuple(map(int, c.split(","))) for c in args.splits])
    configs = [GemvConfig(*map(int, c.split(","))) for c in args.configs] if args.configs else list(CONFIGS)
    dev, bs, D = "cuda", 16, 128
    for R, ctx in itertools.product(map(int, args.rows.split(",")), map(int, args.ctx.split(","))):
        nb = R * (-(-ctx // bs)) + 1
        cache = torch.randn(nb, 1, 2, bs, args.kv_heads, D, device=dev, dtype=torch.bfloat16)
        tab = torch.randperm(nb - 1, device=dev)[: R * (-(-ctx // bs))].view(R, -1)
        pos = torch.full((R,), ctx - 1, device=dev)
        q = torch.randn(R, args.heads, D, device=dev, dtype=torch.bfloat16)
        res = []
        for bn, warps, splits in itertools.product((32, 64, 128), (2, 4, 8), (1, 4, 8, 16, 32, 64)):
            t = bench(lambda: da.decode_attention(cache, 0, q, tab, pos, bs, splits, bn, warps))
            res.append((t, bn, warps, splits))
        res.sort()
        kv_mb = R * ctx * args.kv_heads * D * 2 * 2 / 1e6
        planned = da.plan_splits(R, args.kv_heads, q.device)
        print(
            f"decode attention rows {R} ctx {ctx} ({kv_mb:.1f} MB of KV), planned splits {planned}: "
            "fastest (us, block_n, warps, splits):",
            [(round(t, 1), bn, w, s) for t, bn, w, s in res[:6]],
            "default:",
            round(bench(lambda: da.decode_attention(cache, 0, q, tab, pos, bs)), 1),
        )
    for shape in args.shapes.split(","):
        N, K = map(int, shape.split("x"))
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
        res = [(bench(lambda: F.linear(x, w)), "cublas")]
        for cfg in configs:
            res.append((bench(lambda: gemv(x, w, cfg)), str(cfg)))
        res.sort(key=lambda r: r[0])
        print(
            f"gemv {shape} ({N * K * 2 / 1e6:.1f} MB): fastest (us, config):",
            [(round(t, 1), c) for t, c in res[:5]],
            "cublas:",
            [round(t, 1) for t, c in res if c == "cublas"],
            f"CONFIG {CONFIG}:",
            [round(t, 1) for t, c in res if c == str(CONFIG)],
            f"-> {N * K * 2 / res[0][0] / 1e3:.0f} GB/s",
        )


if __name__ == "__main__":
    main()
