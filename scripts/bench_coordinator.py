"""Coordinator overhead: the same worker engine driven in-process vs through rlt.Engine.

    python scripts/bench_coordinator.py [--model DIR] [--requests 64] [--max-tokens 64]

TTFT: one request (16-token prompt), from submission to its first token, median of --ttft-runs.
Throughput: --requests concurrent greedy requests streaming --max-tokens tokens each; output tokens/s.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402
from rlt.config import ModelConfig  # noqa: E402
from rlt.control.validation import resolve_params  # noqa: E402
from rlt.default_model import default_model_path  # noqa: E402
from rlt.models.loader import load_model  # noqa: E402
from rlt.workers.engine import EngineConfig, LoopEngine  # noqa: E402


def prompts(n, vocab):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (16,), generator=g).tolist() for _ in range(n)]


def direct(path, n, max_tokens, ttft_runs):
    mc = ModelConfig.from_pretrained(path)
    model = load_model(mc, torch.float32)
    eng = LoopEngine(mc, model, EngineConfig(max_num_seqs=max(n, 1)), torch.float32)
    sp = rlt.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ttfts = []
    for i, p in enumerate(prompts(ttft_runs, mc.vocab_size)):
        t0 = time.perf_counter()
        eng.add_request(f"t{i}", p, resolve_params(mc, len(p), rlt.SamplingParams(max_tokens=1, temperature=0)))
        while not eng.step():
            pass
        ttfts.append(time.perf_counter() - t0)
    t0, tokens = time.perf_counter(), 0
    for i, p in enumerate(prompts(n, mc.vocab_size)):
        eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
    while eng.has_work():
        tokens += len(eng.step())
    return statistics.median(ttfts), tokens / (time.perf_counter() - t0)


async def through_engine(path, n, max_tokens, ttft_runs):
    async with rlt.Engine.launch(path, max_num_seqs=max(n, 1)) as engine:
        vocab = engine.model_config.vocab_size
        ttfts = []
        for p in prompts(ttft_runs, vocab):
            t0 = time.perf_counter()
            async for _ in engine.generate(p, rlt.SamplingParams(max_tokens=1, temperature=0)):
                ttfts.append(time.perf_counter() - t0)
        sp = rlt.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        counts = []

        async def one(p):
            async for out in engine.generate(p, sp):
                pass
            counts.append(len(out.token_ids))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts(n, vocab)))
        return statistics.median(ttfts), sum(counts) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-runs", type=int, default=20)
    args = ap.parse_args()
    path = args.model or default_model_path()
    d_ttft, d_tps = direct(path, args.requests, args.max_tokens, args.ttft_runs)
    import uvloop

    e_ttft, e_tps = uvloop.run(through_engine(path, args.requests, args.max_tokens, args.ttft_runs))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "commit": commit, "cpus": os.cpu_count(),
                      "model": path, "command": " ".join(sys.argv)}))
    print(f"{'':>22} {'TTFT ms':>9} {'tok/s':>9}")
    print(f"{'direct (in-process)':>22} {d_ttft * 1e3:>9.2f} {d_tps:>9.1f}")
    print(f"{'rlt.Engine':>22} {e_ttft * 1e3:>9.2f} {e_tps:>9.1f}")
    print(f"added TTFT {1e3 * (e_ttft - d_ttft):.2f} ms; throughput ratio {e_tps / d_tps:.3f}")


if __name__ == "__main__":
    main()
