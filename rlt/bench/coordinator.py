"""Coordinator overhead: the same worker engine driven in-process and through rlt.Engine (CPU).

TTFT: one request (16-token prompt), from submission to its first token, median of `ttft_runs`.
Throughput: `n` concurrent greedy requests streaming `max_tokens` tokens each; output tokens/s.
"""

import asyncio
import statistics
import time

import torch

import rlt
from rlt.config import EngineConfig, ModelConfig
from rlt.models.loader import load_model
from rlt.sampling_params import SamplingParams
from rlt.validation import resolve_params
from rlt.workers.engine import LoopEngine


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (16,), generator=g).tolist() for _ in range(n)]


def direct(path: str, n: int, max_tokens: int, ttft_runs: int) -> tuple[float, float]:
    """(median TTFT s, output tokens/s) of a LoopEngine stepped in this process."""
    mc = ModelConfig.from_pretrained(path)
    model = load_model(mc, torch.float32)
    eng = LoopEngine(mc, model, EngineConfig(max_num_seqs=max(n, 1)), torch.float32)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ttfts = []
    for i, p in enumerate(prompts(ttft_runs, mc.vocab_size)):
        t0 = time.perf_counter()
        eng.add_request(f"t{i}", p, resolve_params(mc, len(p), SamplingParams(max_tokens=1, temperature=0)))
        while not eng.step():
            pass
        ttfts.append(time.perf_counter() - t0)
    t0, tokens = time.perf_counter(), 0
    for i, p in enumerate(prompts(n, mc.vocab_size)):
        eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
    while eng.has_work():
        tokens += len(eng.step())
    return statistics.median(ttfts), tokens / (time.perf_counter() - t0)


async def through_engine(path: str, n: int, max_tokens: int, ttft_runs: int) -> tuple[float, float]:
    """(median TTFT s, output tokens/s) of the same requests through rlt.Engine and its worker."""
    async with rlt.Engine.launch(path, max_num_seqs=max(n, 1)) as engine:
        vocab = engine.model_config.vocab_size
        ttfts = []
        for p in prompts(ttft_runs, vocab):
            t0 = time.perf_counter()
            async for _ in engine.generate(p, SamplingParams(max_tokens=1, temperature=0)):
                ttfts.append(time.perf_counter() - t0)
        sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        counts = []

        async def one(p):
            async for out in engine.generate(p, sp):
                pass
            counts.append(len(out.token_ids))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts(n, vocab)))
        return statistics.median(ttfts), sum(counts) / (time.perf_counter() - t0)
