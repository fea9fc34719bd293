"""Times the general paged attention kernel at the passes it serves, over query heads per item
of segments shorter than a tile (1, or a GQA group's as the engine packs them), tile rows, key
tile, warps, stages and a split pass's key slices, against flash SDPA over the same rows and keys
(contiguous, the floor), checking each config against the torch reference. Prints the fastest
first and the engine's plan, and SDPA after gathering the K/V out of the blocks (a gather path's
price).

  python scripts/tune_paged.py [--heads 48 --kv-heads 8 --dim 128] [--cases hit,prompt,chunk,mixed]

Cases: hit (128 new rows after a cached 4,096-token prefix), prompt (one 1,024-token prompt from
position 0, as a pass graph runs it), chunk (a 4,096-token prompt's second 2,048-row chunk), mixed
(64 decode rows at 1,024 keys beside a 512-row first chunk).
"""

import argparse
import itertools
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from rlt.kernels import paged_attention_triton as pat
from rlt.kernels.attention_steps import num_sms
from rlt.kernels.paged_attention import KernelPlan, PagedMetadata, kernel_fields, paged_attention, split_count

CASES = {  # segments: (first position, rows)
    "hit": [(4096, 128)],
    "prompt": [(0, 1024)],
    "chunk": [(2048, 2048)],
    "mixed": [(1024, 1)] * 64 + [(0, 512)],
}


def bench(fn) -> float:
    return do_bench(fn, warmup=5, rep=30, return_mode="median") * 1e3  # us


def case(segs, H, Hkv, D, bs=16, dev="cuda"):
    """Paged K/V of every segment's keys in scattered blocks, q of its rows, and the same K/V
    contiguous per segment (for SDPA)."""
    g = torch.Generator(device=dev).manual_seed(0)
    nblocks = [-(-(q0 + n) // bs) for q0, n in segs]
    perm = torch.randperm(sum(nblocks), device=dev)
    cache = torch.randn(sum(nblocks), 1, 2, bs, Hkv, D, device=dev, generator=g, dtype=torch.bfloat16)
    tab = torch.zeros(len(segs), max(nblocks), dtype=torch.int64, device=dev)
    first = np.cumsum([0] + nblocks)
    for i, nb in enumerate(nblocks):
        tab[i, :nb] = perm[first[i] : first[i] + nb]
    row_starts = np.cumsum([0] + [n for _, n in segs]).tolist()
    q = torch.randn(row_starts[-1], H, D, device=dev, generator=g, dtype=torch.bfloat16)
    kv = [cache[tab[i, :nb], 0].movedim(1, 0).flatten(1, 2)[:, : q0 + n] for i, (q0, n) in enumerate(segs)]
    return cache, tab, q, row_starts, [q0 for q0, _ in segs], kv


def sdpa(q, row_starts, q_starts, kv, H, Hkv):
    """Flash SDPA per segment on contiguous K/V (rows ending their keys: lower-right causal)."""
    from torch.nn.attention.bias import causal_lower_right

    for i, (r0, r1) in enumerate(zip(row_starts, row_starts[1:])):
        k, v = (t.transpose(0, 1).unsqueeze(0) for t in kv[i])  # [1, Hkv, keys, D]
        if Hkv != H:
            k, v = (t.repeat_interleave(H // Hkv, 1) for t in (k, v))
        qq = q[r0:r1].transpose(0, 1).unsqueeze(0)
        F.scaled_dot_product_attention(qq, k, v, attn_mask=causal_lower_right(r1 - r0, k.shape[2]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rows", default="64,128", help="tile rows")
    ap.add_argument("--pack", default=None, help="short segments' heads per item (default: 1 and the GQA group)")
    ap.add_argument("--block-n", default="64,128", help="key tile")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="0,1,3,4", help="pipeline stages (0: the engine's, per launch)")
    ap.add_argument("--splits", default="0", help="key slices of a split pass (0: the engine's rule; at most its)")
    args = ap.parse_args()
    H, Hkv, D = args.heads, args.kv_heads, args.dim
    packs = args.pack or ",".join(sorted({"1", str(H // Hkv)}))
    grid = [
        [int(x) for x in a.split(",")] for a in (packs, args.rows, args.block_n, args.warps, args.stages, args.splits)
    ]
    for name in args.cases.split(","):
        tune(name, H, Hkv, D, grid)


def tune(name: str, H: int, Hkv: int, D: int, grid: list[list[int]], bs: int = 16) -> None:
    cache, tab, q, row_starts, q_starts, kv = case(CASES[name], H, Hkv, D, bs)
    ref = paged_attention(cache, 0, PagedMetadata(None, tab, row_starts, q_starts, bs), q, None, None).float()
    floor = bench(lambda: sdpa(q, row_starts, q_starts, kv, H, Hkv))
    keys = [q0 + r1 - r0 for q0, r0, r1 in zip(q_starts, row_starts, row_starts[1:])]
    blocks = [tab[i, : -(-n // bs)] for i, n in enumerate(keys)]

    def gathered():  # each segment's keys copied out of its blocks first (what a gather path would add)
        return [cache[b, 0].movedim(1, 0).flatten(1, 2)[:, :n] for b, n in zip(blocks, keys)]

    gather = bench(lambda: sdpa(q, row_starts, q_starts, gathered(), H, Hkv))
    res = []
    for pack, rows, bn, warps, stages, splits in itertools.product(*grid):
        stages = stages or None
        base = KernelPlan(rows, fill_tiles=-(-num_sms(torch.device("cuda")) // H), pack=pack)  # (as the backend's)
        f = kernel_fields(row_starts, q_starts, base)
        plan = replace(
            base,
            max_splits=split_count(len(f["tile_seg"]), base.fill_tiles),
            packed_splits=split_count(len(f["packed_seg"]), base.packed_fill) if pack > 1 else 1,
        )
        k = {n: torch.from_numpy(a).cuda() for n, a in kernel_fields(row_starts, q_starts, plan).items()}
        if splits and plan.max_splits > 1:  # (fewer slices than the rule's: the scratch holds them)
            if splits > plan.max_splits:
                continue
            plan = replace(plan, max_splits=splits)
            k["work"][0] = splits

        def run(plan=plan, k=k, bn=bn, warps=warps, stages=stages):
            return pat.paged_attention(cache, 0, q, tab, k, bs, plan, bn, warps, stages)

        try:
            err = (run().float() - ref).abs().max().item()
        except Exception as e:  # (a config the compiler refuses: out of shared memory, registers)
            print(f"  {name}: pack {pack} rows {rows} block_n {bn} warps {warps} stages {stages}: {type(e).__name__}")
            continue
        res.append((bench(run), pack, rows, bn, warps, stages, plan.max_splits, err))
    res.sort(key=lambda r: r[0])
    print(
        f"{name} (H {H}, Hkv {Hkv}, D {D}): flash SDPA on contiguous K/V {floor:.1f} us, with the K/V gathered "
        f"from the blocks first {gather:.1f} us; fastest "
        "(us, x SDPA, short segments' heads per item, tile rows, block_n, warps, stages, splits, max error):"
    )
    for t, pack, rows, bn, warps, stages, splits, err in res[:8]:
        print(f"  {t:8.1f} {t / floor:6.2f}x  {pack:2} {rows:4} {bn:4} {warps:2} {stages} {splits:3}  {err:.3f}")
    for pack in sorted({r[1] for r in res}):
        for t, *_ in [r for r in res if r[1:6] == (pack, 64, pat.BLOCK_N, 4, None)]:
            print(f"  packing {pack}, 64 rows, block_n {pat.BLOCK_N}, 4 warps, the engine's stages: {t:.1f} us")


if __name__ == "__main__":
    main()
