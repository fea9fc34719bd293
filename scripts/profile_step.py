"""Where a decode step's host time goes: cProfile over engine steps (any device).

    python scripts/profile_step.py --model DIR --device cuda --concurrency 1 --steps 200
"""

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rlt.config import ModelConfig  # noqa: E402
from rlt.control.validation import resolve_params  # noqa: E402
from rlt.models.loader import load_model, resolve_dtype  # noqa: E402
from rlt.sampling_params import SamplingParams  # noqa: E402
from rlt.workers.engine import EngineConfig, LoopEngine  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--threshold", type=float, default=1.0)
    ap.add_argument("--kv-gib", type=float, default=20)
    args = ap.parse_args()
    mc = ModelConfig.from_pretrained(args.model)
    dtype = resolve_dtype(None, args.device, mc)
    model = load_model(mc, dtype, args.device)
    eng = LoopEngine(mc, model, EngineConfig(max_num_seqs=args.concurrency, kv_memory_bytes=int(args.kv_gib * 2**30),
                                             prefill_chunk=args.prompt_len, max_num_batched_tokens=16384),
                     dtype, args.device)
    sp = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True, exit_threshold=args.threshold)
    g = torch.Generator().manual_seed(0)
    for i in range(args.concurrency):
        p = torch.randint(3, mc.vocab_size, (args.prompt_len,), generator=g).tolist()
        eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
    for _ in range(3 * mc.depth + 8):  # prefill and graph capture happen here
        eng.step()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        eng.step()
    sync()
    prof.disable()
    dt = time.perf_counter() - t0
    print(f"{args.steps} steps at concurrency {args.concurrency}: {dt / args.steps * 1e3:.2f} ms per loop step "
          f"(cProfile on)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
