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


def test_batch_invariant_kernels_match_torch_and_ignore_the_batch():
    import torch.nn.functional as F

    from rlt.kernels.batch_invariant import linear, rms_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    for K, N in ((3072, 1024), (2048, 5632), (96, 200)):
        x = torch.randn(300, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
        y = linear(x, w)
        ref = F.linear(x.float(), w.float())
        assert (y.float() - ref).abs().max() <= 2e-2 * ref.abs().max()
        for rows in (slice(0, 1), slice(5, 12), slice(17, 18), slice(0, 300)):
            assert torch.equal(linear(x[rows], w), y[rows])
        wn = (1 + 0.1 * torch.randn(K, device="cuda", generator=g)).bfloat16()
        r = rms_norm(x, wn, 1e-5)
        xf = x.float()
        ref = wn * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
        assert (r.float() - ref.float()).abs().max() <= 2e-2 * ref.float().abs().max()
        for rows in (slice(0, 1), slice(5, 12), slice(0, 300)):
            assert torch.equal(rms_norm(x[rows], wn, 1e-5), r[rows])


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_engine_batch_invariant_bf16(checkpoints, family):
    """With batch_invariant on, a request's tokens and depths are the same alone and in a batch."""
    from rlt.models.layers import set_batch_invariant

    mc = ModelConfig.from_pretrained(checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn"
                                     else None)
    model = load_model(mc, torch.bfloat16, "cuda")
    cfg = EngineConfig(num_blocks=512, prefill_chunk=8, batch_invariant=True)
    prompts = [[5 + (i * 7 + j) % 400 for j in range(n)] for i, n in enumerate((9, 30, 17, 44))]
    sps = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                          exit_threshold=0.5 if family == "ouro" else None),
           SamplingParams(max_tokens=10, temperature=0.9, seed=4, ignore_eos=True)] * 2

    def run(items):
        eng = LoopEngine(mc, model, cfg, torch.bfloat16, "cuda")
        for rid, (p, sp) in items:
            eng.add_request(rid, p, resolve_params(mc, len(p), sp))
        out = {rid: [] for rid, _ in items}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth))
        return out

    try:
        items = [(str(i), (p, sp)) for i, (p, sp) in enumerate(zip(prompts, sps))]
        together = run(items)
        for item in items:
            assert run([item])[item[0]] == together[item[0]]
    finally:
        set_batch_invariant(False)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("H,Hkv,D", [(16, 16, 128), (48, 8, 128), (4, 2, 16), (55, 55, 96)])
def test_triton_paged_attention_matches_reference(dtype, tol, H, Hkv, D):
    import random

    import numpy as np

    from rlt.kernels.paged_attention import PagedMetadata, kernel_fields, paged_attention

    rng = random.Random(0)
    bs, L, NB = 16, 2, 400
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.randn(NB, L, 2, bs, Hkv, D, device="cuda", generator=g).to(dtype)
    # prompt chunks (first and later), decode rows at various positions, a long context
    segs = [(0, 37), (100, 1), (5, 1), (250, 64), (1500, 1), (16, 16), (700, 19)]
    tables = [rng.sample(range(NB), -(-(q0 + n) // bs)) for q0, n in segs]
    tab = torch.zeros(len(segs), max(map(len, tables)), dtype=torch.int64)
    for i, t in enumerate(tables):
        tab[i, :len(t)] = torch.tensor(t)
    row_starts = np.cumsum([0] + [n for _, n in segs]).tolist()
    q = torch.randn(row_starts[-1], H, D, device="cuda", generator=g).to(dtype)
    slots = torch.zeros(row_starts[-1], dtype=torch.int64, device="cuda")
    ref_meta = PagedMetadata(slots, tab.cuda(), row_starts, [s[0] for s in segs], bs)
    fields = {k: torch.from_numpy(v).cuda() for k, v in kernel_fields(row_starts, [s[0] for s in segs]).items()}
    kern_meta = PagedMetadata(slots, tab.cuda(), row_starts, [s[0] for s in segs], bs, fields)
    from rlt.kernels import paged_attention_triton as pat

    for layer in range(L):
        ref = paged_attention(cache, layer, ref_meta, q).float()
        got = paged_attention(cache, layer, kern_meta, q).float()
        assert (got - ref).abs().max() <= tol * max(1.0, ref.abs().max().item())
        split = pat.paged_attention(cache, layer, q, tab.cuda(), fields, bs, splits=pat.DECODE_SPLITS).float()
        assert (split - ref).abs().max() <= tol * max(1.0, ref.abs().max().item())
        # one segment alone gives the same bits as inside the batch
        s0 = kernel_fields([0, 19], [700])
        alone = paged_attention(cache, layer, PagedMetadata(slots[:19], tab[6:7].cuda(), [0, 19], [700], bs,
                                                            {k: torch.from_numpy(v).cuda() for k, v in s0.items()}),
                                q[row_starts[6]:row_starts[7]])
        assert torch.equal(alone, paged_attention(cache, layer, kern_meta, q)[row_starts[6]:row_starts[7]])


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_cuda_graphs_equal_eager(checkpoints, family):
    """Decode passes replayed from CUDA graphs (padded batches, rows at different depths) give the
    same tokens and depths as eager passes; with batch-invariant kernels, the same logprobs too."""
    from rlt.models.layers import set_batch_invariant

    mc = ModelConfig.from_pretrained(checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn"
                                     else None)
    model = load_model(mc, torch.bfloat16, "cuda")
    prompts = [[5 + (i * 7 + j) % 400 for j in range(n)] for i, n in enumerate((9, 30, 17, 44, 3))]
    sp = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, logprobs=3,
                        exit_threshold=0.5 if family == "ouro" else None)

    def run(graph_max):
        eng = LoopEngine(mc, model, EngineConfig(num_blocks=512, prefill_chunk=8, batch_invariant=True,
                                                 cuda_graph_max_batch=graph_max), torch.bfloat16, "cuda")
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
        out = {str(i): [] for i in range(len(prompts))}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs))
        return out, eng

    try:
        eager, _ = run(0)
        graphed, eng = run(256)
        assert eng.runner.graphs is not None and eng.runner.graphs.graphs  # graphs were captured and used
        assert graphed == eager
    finally:
        set_batch_invariant(False)


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("D", [128, 96, 16])
def test_rope_kernel_matches_torch(pairs, dtype, tol, D):
    from rlt.kernels.rope import rope_
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(50, 3 * 8 * D, device="cuda", generator=g).to(dtype)
    x = qkv[:, : 8 * D].view(50, 8, D)  # a strided view, as the models pass it
    pos = torch.randint(0, 60000, (50,), device="cuda", generator=g)
    inv = layers.rope_inv_freq(D, 1e6 if not pairs else 5e4).cuda()
    ref = (layers.rope_pairs if pairs else layers.rope_neox)(x.cpu().float(), pos.cpu(), inv.cpu())
    neighbours = qkv[:, 8 * D:].clone()
    got = rope_(x, pos, inv, pairs).float().cpu()
    assert (got - ref).abs().max() <= tol * ref.abs().max()
    assert torch.equal(qkv[:, 8 * D:], neighbours)  # k and v beside q in the projection are untouched


def test_rms_norm_on_cuda_matches_torch():
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 5280, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(5280, device="cuda", generator=g)).bfloat16()
    ref = layers.rms_norm(x.cpu().float(), w.cpu().float(), 1e-6)
    assert (layers.rms_norm(x, w, 1e-6).float().cpu() - ref).abs().max() <= 2e-2 * ref.abs().max()
