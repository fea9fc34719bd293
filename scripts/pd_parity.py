"""Does 1p1d produce exactly what single produces? Prompts of several lengths, greedy.

    python scripts/pd_parity.py --model DIR [--device cuda] [--dtype bfloat16] [--lengths 128,...,4096]

Each topology serves the prompts twice: one at a time (so both see the same batch shapes) and all
at once. Reports, per mode, how many requests match token for token and exit depth for exit
depth, and the first divergence of any that do not. The comparison is rlt/bench/parity.py.
"""

import argparse
import json
import random
import sys
import time

import rlt
from rlt.bench.parity import parity


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
    mc = rlt.ModelConfig.from_pretrained(args.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, mc.vocab_size) for _ in range(int(n))] for n in args.lengths.split(",")]
    launch = dict(
        device=args.device,
        dtype=args.dtype,
        kv_memory_bytes=args.kv_gib << 30,
        prefill_chunk=args.prefill_chunk,
        max_num_seqs=64,
        max_num_batched_tokens=max(4096, args.prefill_chunk),
        startup_timeout=900.0,
        heartbeat_timeout=120.0,
        batch_invariant=args.batch_invariant,
    )
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "model": args.model,
        "family": mc.family,
        "device": args.device,
        "dtype": args.dtype,
        "batch_invariant": args.batch_invariant,
        "lengths": args.lengths,
        "max_tokens": args.max_tokens,
        "command": " ".join(sys.argv),
        **parity(args.model, args.topology, prompts, args.max_tokens, **launch),
    }
    print(json.dumps(report, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
