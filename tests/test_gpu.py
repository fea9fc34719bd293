"""GPU checks (run on the GPU machine: `pytest -m gpu`): the same engine in bf16 on CUDA against
float32 on the CPU, the counter-based RNG and sampler bit for bit across devices, and PD across
two GPUs against single."""

import asyncio

import pytest
import torch

import rlt
from rlt.config import ModelConfig
from rlt.control.validation import resolve_params
from rlt.kernels.random import random_bits
from rlt.kernels.sampler import SamplingTensors, sample
from rlt.models.loader import load_model
from rlt.sampling_params import SamplingParams
from rlt.workers.engine import EngineConfig, LoopEngine

pytestmark = pytest.mark.gpu


def first_logprobs(path, device, dtype, prompt):
    mc = ModelConfig.from_pretrained(path, hf_overrides={"mean_recurrence": 8} if "huginn" in path else None)
    eng = LoopEngine(mc, load_model(mc, dtype, device), EngineConfig(num_blocks=256), dtype, device)
    eng.add_request("a", prompt, resolve_params(mc, len(prompt), SamplingParams(max_tokens=1, temperature=0,
                                                                                logprobs=5)))
    outs = []
    while eng.has_work():
        outs += eng.step()
    return outs[0]


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_bf16_cuda_close_to_fp32_cpu(checkpoints, family):
    prompt = [11, 42, 7, 300, 19, 5, 88, 250, 3] * 7
    ref = first_logprobs(checkpoints[family], "cpu", torch.float32, prompt)
    got = first_logprobs(checkpoints[family], "cuda", torch.bfloat16, prompt)
    for tok, lp in ref.logprobs.items():
        if tok in got.logprobs:
            assert abs(got.logprobs[tok] - lp) < 0.15, (tok, got.logprobs[tok], lp)
    top = sorted(ref.logprobs.values(), reverse=True)
    if top[0] - top[1] > 0.3:  # a clear winner must win in bf16 too
        assert got.token_id == ref.token_id


def test_rng_and_sampler_identical_on_cpu_and_cuda():
    seed, counter, idx = torch.tensor([[123456789012]]), torch.tensor([[7]]), torch.arange(100000)[None]
    assert torch.equal(random_bits(seed, 1, counter, idx), random_bits(seed.cuda(), 1, counter.cuda(), idx.cuda()).cpu())
    logits = torch.randn(8, 5000, generator=torch.Generator().manual_seed(0))
    p = SamplingTensors(torch.full((8,), 0.9), torch.tensor([0, 5, 50, 0, 0, 20, 0, 0]),
                        torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.8, 1.0, 0.95]), torch.arange(8) + 3,
                        torch.arange(8))
    cuda_p = SamplingTensors(*(t.cuda() for t in (p.temperature, p.top_k, p.top_p, p.seed, p.output_index)))
    assert torch.equal(sample(logits, p), sample(logits.cuda(), cuda_p).cpu())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_pd_on_two_gpus_equals_single(checkpoints):
    prompts = [[5 + i for i in range(n)] for n in (9, 40, 100)]
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, exit_threshold=0.5)

    async def serve(topology):
        async with rlt.Engine.launch(checkpoints["ouro"], topology=topology, device="cuda", dtype="bfloat16",
                                     prefill_chunk=16, num_blocks=512) as engine:
            outs = []
            for i, p in enumerate(prompts):  # one at a time: identical batch shapes on both sides
                async for out in engine.generate(p, sp, request_id=str(i)):
                    pass
                outs.append((out.token_ids, out.exit_depths))
            pids = [w["pid"] for w in engine.stats()["workers"]]
            return outs, pids

    single, _ = asyncio.run(serve("single"))
    pd, pids = asyncio.run(serve("1p1d"))
    assert len(pids) == 2
    assert single == pd
