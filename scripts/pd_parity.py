"""Does 1p1d produce exactly what single produces? Prompts of several lengths, greedy.

    python scripts/pd_parity.py --model DIR [--device cuda] [--dtype bfloat16] [--lengths 128,...,4096]

Each topology serves the prompts twice: one at a time (so both see the same batch shapes) and all
at once. Reports, per mode, how many requests match token for token and exit depth for exit
depth, and the first divergence of any that do not.
"""

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402


async def serve(args, topology, prompts, sp):
    opts = dict(kv_memory_bytes=args.kv_gib << 30, prefill_chunk=args.prefill_chunk, max_num_seqs=64,
                max_num_batched_tokens=max(4096, args.prefill_chunk), startup_timeout=900.0,
                heartbeat_timeout=120.0, batch_invariant=args.batch_invariant)
    t0 = time.perf_counter()
    async with rlt.Engine.launch(args.model, topology=topology, device=args.device, dtype=args.dtype,
                                 **opts) as engine:
        ready = time.perf_counter() - t0

        async def one(i, p):
            async for out in engine.generate(p, sp, request_id=f"{topology}-{i}"):
                pass
            return out.token_ids, out.exit_depths

        t1 = time.perf_counter()
        seq = [await one(i, p) for i, p in enumerate(prompts)]
        t2 = time.perf_counter()
        conc = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        t3 = time.perf_counter()
        return {"sequential": seq, "concurrent": list(conc), "ready_s": ready, "sequential_s": t2 - t1,
                "concurrent_s": t3 - t2, "stats": engine.stats()}


def compare(a, b):
    same, diffs = 0, []
    for i, ((ta, da), (tb, db)) in enumerate(zip(a, b)):
        if ta == tb and da == db:
            same += 1
        else:
            k = next(j for j in range(min(len(ta), len(tb))) if ta[j] != tb[j] or da[j] != db[j])
            diffs.append({"request": i, "first_divergence": k})
    return same, diffs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--lengths", default="128,512,1024,2048,4096,300,777,4096")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--kv-gib", type=int, default=24)
    ap.add_argument("--topology", default="1p1d")
    ap.add_argument("--batch-invariant", action="store_true", help="batch-invariant GEMM/RMSNorm kernels")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    import random

    mc = rlt.ModelConfig.from_pretrained(args.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, mc.vocab_size) for _ in range(int(n))] for n in args.lengths.split(",")]
    sp = rlt.SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    single = asyncio.run(serve(args, "single", prompts, sp))
    pd = asyncio.run(serve(args, args.topology, prompts, sp))
    report = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "family": mc.family, "device": args.device,
              "dtype": args.dtype, "batch_invariant": args.batch_invariant, "lengths": args.lengths, "max_tokens": args.max_tokens,
              "command": " ".join(sys.argv)}
    for mode in ("sequential", "concurrent"):
        same, diffs = compare(single[mode], pd[mode])
        report[mode] = {"match": same, "of": len(prompts), "diffs": diffs,
                        "single_s": round(single[f"{mode}_s"], 2), "pd_s": round(pd[f"{mode}_s"], 2)}
    report["ready_s"] = {"single": round(single["ready_s"], 1), args.topology: round(pd["ready_s"], 1)}
    print(json.dumps(report, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
