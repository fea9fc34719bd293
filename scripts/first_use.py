"""First-use work after READY on a GPU worker: CUDA-graph captures and Triton specializations,
per phase of a mixed workload (what issue #17 wants at zero).

    python scripts/first_use.py --model DIR [--device cuda] [--topology 1p1d] [--kv-gib 40]
"""

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402
from rlt import SamplingParams  # noqa: E402

PHASES = [  # (name, prompt lengths, output tokens, exit threshold)
    ("one short request", [16], 32, 1.0),
    ("8 short", [16] * 8, 32, 1.0),
    ("8 short, adaptive exit", [16] * 8, 32, 0.5),
    ("one 1K prompt", [1024], 16, 1.0),
    ("mixed 128/4096 x8", [128, 4096] * 4, 32, 1.0),
    ("64 mixed lengths", [16 + 61 * i for i in range(64)], 48, 1.0),
    ("the same again", [16 + 61 * i for i in range(64)], 48, 1.0),
]


async def main(args):
    kv = dict(kv_memory_bytes=int(args.kv_gib * 2**30)) if args.kv_gib else {}
    async with rlt.Engine.launch(
        args.model, device=args.device, topology=args.topology, startup_timeout=900, **kv
    ) as engine:
        print(f"{'phase':<26} {'s':>6} {'captures':>9} {'compiles':>9}  (since READY)")
        for name, lens, out, thr in PHASES:
            t0 = time.perf_counter()
            sp = SamplingParams(max_tokens=out, temperature=0, ignore_eos=True, exit_threshold=thr)

            async def one(n, i, sp=sp):
                async for _ in engine.generate([3 + (i * 7 + j) % 500 for j in range(n)], sp):
                    pass

            await asyncio.gather(*(one(n, i) for i, n in enumerate(lens)))
            ws = engine.stats()["workers"]  # summed over the workers
            print(
                f"{name:<26} {time.perf_counter() - t0:>6.2f} {sum(w['captures_after_ready'] for w in ws):>9} "
                f"{sum(w['compiles_after_ready'] for w in ws):>9}",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--topology", default="single")
    ap.add_argument("--kv-gib", type=float, help="KV pool per worker (default: the engine's)")
    asyncio.run(main(ap.parse_args()))
