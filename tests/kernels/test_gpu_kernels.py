"""GPU checks of the kernels (run on the GPU machine: `pytest -m gpu`): the Triton kernels against
their torch references, the counter-based RNG and sampler bit for bit across devices, the
batch-invariant kernels independent of the batch."""

import pytest
import torch

from rlt.kernels.random import random_bits
from rlt.kernels.sampler import SamplingTensors, sample
from tests.kernels.kernel_cases import decode_case

pytestmark = pytest.mark.gpu


def test_rng_and_sampler_identical_on_cpu_and_cuda():
    seed, counter, idx = (
        torch.tensor([[123456789012]]),
        torch.tensor([[7]]),
        torch.arange(100000)[None],
    )
    assert torch.equal(
        random_bits(seed, 1, counter, idx),
        random_bits(seed.cuda(), 1, counter.cuda(), idx.cuda()).cpu(),
    )
    logits = torch.randn(8, 5000, generator=torch.Generator().manual_seed(0))
    p = SamplingTensors(
        torch.full((8,), 0.9),
        torch.tensor([0, 5, 50, 0, 0, 20, 0, 0]),
        torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.8, 1.0, 0.95]),
        torch.arange(8) + 3,
        torch.arange(8),
    )
    cuda_p = SamplingTensors(
        *(t.cuda() for t in (p.temperature, p.top_k, p.top_p, p.seed, p.output_index))
    )
    assert torch.equal(sample(logits, p), sample(logits.cuda(), cuda_p).cpu())


def test_batch_invariant_kernels_match_torch_and_ignore_the_batch():
    import torch.nn.functional as F

    from rlt.kernels.batch_invariant import linear
    from rlt.kernels.norm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    for K, N in ((3072, 1024), (2048, 5632), (96, 200)):
        x = torch.randn(300, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).bfloat16()
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


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("H,Hkv,D", [(16, 16, 128), (48, 8, 128), (4, 2, 16), (55, 55, 96)])
def test_triton_paged_attention_matches_reference(dtype, tol, H, Hkv, D):
    """Every tiling the runner uses (decode tiles, prefill tiles with prefix-free chunks on dense
    SDPA, keys split into slices) against the torch reference, on K/V written by the KV-write kernel."""
    import random

    import numpy as np

    from rlt.kernels.paged_attention import (
        KernelPlan,
        PagedMetadata,
        kernel_fields,
        kernel_paged_attention,
        paged_attention,
        plan_kernel,
        write_kv,
    )

    rng = random.Random(0)
    bs, L, NB = 16, 2, 700
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.randn(NB, L, 2, bs, Hkv, D, device="cuda", generator=g).to(dtype)
    # prompt chunks (first and later, some prefix-free and long), decode rows, a long context
    segs = [(0, 37), (100, 1), (5, 1), (250, 64), (1500, 1), (16, 16), (700, 19), (0, 300), (0, 64)]
    blocks = rng.sample(range(NB), sum(-(-(q0 + n) // bs) for q0, n in segs))
    tables = []
    for q0, n in segs:
        tables.append(blocks[: -(-(q0 + n) // bs)])
        blocks = blocks[len(tables[-1]) :]
    tab = torch.zeros(len(segs), max(map(len, tables)), dtype=torch.int64)
    for i, t in enumerate(tables):
        tab[i, : len(t)] = torch.tensor(t)
    tab = tab.cuda()
    row_starts = np.cumsum([0] + [n for _, n in segs]).tolist()
    q_starts = [s[0] for s in segs]
    T = row_starts[-1]
    # q, k, v as the model hands them over: views of the fused projection (rows strided)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, device="cuda", generator=g).to(dtype)
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=1)
    q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
    slots = torch.tensor(
        [t[p // bs] * bs + p % bs for (q0, n), t in zip(segs, tables) for p in range(q0, q0 + n)],
        device="cuda",
    )
    ref_meta = PagedMetadata(slots, tab, row_starts, q_starts, bs)
    for layer in range(L):
        write_kv(cache, layer, ref_meta, k, v)

    def meta(plan):
        f = {
            n: torch.from_numpy(a).cuda()
            for n, a in kernel_fields(row_starts, q_starts, plan).items()
        }
        return PagedMetadata(slots, tab, row_starts, q_starts, bs, f, plan)

    prefill = plan_kernel(row_starts, q_starts, batch_invariant=False)
    assert prefill.tile_rows == 64 and prefill.dense == (7, 8)  # prefix-free and >= 64 rows
    assert plan_kernel(row_starts, q_starts, batch_invariant=True) == KernelPlan()
    assert plan_kernel(row_starts, q_starts, batch_invariant=True, fill_tiles=132) == KernelPlan()
    # keys split into slices (merged by the last to finish), in tiles of 64 and of 16
    split = plan_kernel(row_starts, q_starts, batch_invariant=False, fill_tiles=132)
    assert split.max_splits == 16, split
    split16 = KernelPlan(fill_tiles=132, max_splits=16)
    # segments shorter than a tile in a second launch, a GQA group's heads per item: a pass's plan,
    # whole and with keys split, and tiles of 16 beside packed ones, both lists split
    group = H // Hkv
    packed = [plan_kernel(row_starts, q_starts, False, fill, group) for fill in (0, 132)]
    packed.append(KernelPlan(16, fill_tiles=132, max_splits=16, pack=group, packed_splits=16))
    assert packed[0].tile_rows == 64 and (group == 1 or packed[1].packed_splits > 1)
    for layer in range(L):
        ref = paged_attention(cache, layer, ref_meta, q, k, v).float()
        bound = tol * max(1.0, ref.abs().max().item())
        for plan in (KernelPlan(), prefill, KernelPlan(64), split, split16, *packed):
            got = kernel_paged_attention(cache, layer, meta(plan), q, k, v).float()
            assert (got - ref).abs().max() <= bound, plan
        m16 = meta(KernelPlan())
        # one segment alone gives the same bits as inside the batch
        alone = PagedMetadata(
            slots[row_starts[6] : row_starts[7]],
            tab[6:7],
            [0, 19],
            [700],
            bs,
            {n: torch.from_numpy(a).cuda() for n, a in kernel_fields([0, 19], [700]).items()},
        )
        r6 = slice(row_starts[6], row_starts[7])
        assert torch.equal(
            kernel_paged_attention(cache, layer, alone, q[r6], k[r6], v[r6]),
            kernel_paged_attention(cache, layer, m16, q, k, v)[r6],
        )
        # a lone prompt chunk at position 0: dense SDPA's output itself, no buffer
        r7 = slice(row_starts[7], row_starts[8])
        lone_plan = plan_kernel([0, 300], [0], batch_invariant=False)
        assert lone_plan.dense == (0,)
        fields = {
            n: torch.from_numpy(a).cuda()
            for n, a in kernel_fields([0, 300], [0], lone_plan).items()
        }
        lone = PagedMetadata(slots[r7], tab[7:8], [0, 300], [0], bs, fields, lone_plan)
        assert (
            kernel_paged_attention(cache, layer, lone, q[r7], k[r7], v[r7]).float() - ref[r7]
        ).abs().max() <= bound


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("H,Hkv,D", [(16, 16, 128), (48, 8, 128), (4, 2, 16), (55, 55, 96)])
def test_decode_attention_matches_reference(dtype, tol, H, Hkv, D):
    """The decode kernel (GQA group per program; 1, 2, 8, 32, 64, 128 key slices merged by a second
    launch — most of them empty for the shorter rows — and the planned count) against the torch
    reference, and a decode-only pass's plan takes it."""
    from rlt.kernels import decode_attention as da
    from rlt.kernels.paged_attention import (
        PagedMetadata,
        kernel_fields,
        kernel_paged_attention,
        paged_attention,
        plan_kernel,
    )

    cache, meta, tab, q, pos = decode_case(H, Hkv, D, dtype, "cuda")
    fields = {
        k: torch.from_numpy(a).cuda()
        for k, a in kernel_fields(meta.row_starts, meta.q_starts).items()
    }
    plan = plan_kernel(meta.row_starts, meta.q_starts, batch_invariant=False)
    assert (
        plan.decode and not plan_kernel(meta.row_starts, meta.q_starts, batch_invariant=True).decode
    )
    kernel_meta = PagedMetadata(
        meta.slot_mapping, tab, meta.row_starts, meta.q_starts, meta.block_size, fields, plan
    )
    for layer in range(cache.shape[1]):
        ref = paged_attention(cache, layer, meta, q, None, None).float()
        bound = tol * max(1.0, ref.abs().max().item())
        for splits in (1, 2, 8, 32, 64, 128, None):
            got = da.decode_attention(cache, layer, q, tab, pos, meta.block_size, splits).float()
            assert (got - ref).abs().max() <= bound, splits
        assert torch.equal(
            kernel_paged_attention(cache, layer, kernel_meta, q, None, None),
            da.decode_attention(cache, layer, q, tab, pos, meta.block_size),
        )


def test_gemv_matches_torch():
    """Every GEMV config, and the engine's one-row path, against F.linear, at decode shapes (Ouro's
    q/k/v, output, gate/up, down projections) and a ragged one; more K tiles read before the PDL
    wait change no bit."""
    import torch.nn.functional as F

    from rlt.kernels import gemv as gv
    from rlt.models.ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        for N, K in ((6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (37, 300)):
            x = torch.randn(1, K, device="cuda", generator=g).to(dtype)
            w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).to(dtype)
            ref = F.linear(x.float(), w.float())
            bound = tol * ref.abs().max().item()
            for cfg in gv.CONFIGS:
                assert (gv.gemv(x, w, cfg).float() - ref).abs().max() <= bound, (N, K, str(cfg))
            # the engine's one-row path
            assert torch.equal(ops.linear(x, w), gv.gemv(x, w, gv.CONFIG))
            for early in (2, 3):  # tiles read before the wait: the same sums in the same order
                assert torch.equal(gv.gemv(x, w, gv.CONFIG, early), gv.gemv(x, w, gv.CONFIG)), (
                    N,
                    K,
                    early,
                )


def test_skinny_gemm_in_the_engines_few_row_products():
    """2 to 32 rows: the skinny GEMM (every config, plain and with the SwiGLU) against the float32
    product; from 3 rows the engine's ops take it for q/k/v-like and [gate; up] products where
    K >= 3,072 and keep cuBLAS below that (Ouro's)."""
    import torch.nn.functional as F

    from rlt.kernels import skinny_gemm as sg
    from rlt.models import layers
    from rlt.models.ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, K in ((8192, 3072), (10752, 3072), (6144, 2048), (40, 3100)):
        w, gate_up = (
            (torch.randn(n, K, device="cuda", generator=g) / K**0.5).bfloat16() for n in (N, 2 * N)
        )
        for M in (2, 5, 16, 32):
            x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
            ref, ref_swiglu = (
                F.linear(x.float(), w.float()),
                layers.swiglu(F.linear(x.float(), gate_up.float())),
            )
            for cfg in sg.CONFIGS:
                err = (sg.skinny_gemm(x, w, cfg).float() - ref).abs().max() / ref.abs().max()
                assert err <= 1e-2, (N, K, M, str(cfg), err)
                got = sg.skinny_gemm_swiglu(x, gate_up, cfg).float()
                assert (got - ref_swiglu).abs().max() <= 2e-2 * ref_swiglu.abs().max(), (
                    N,
                    K,
                    M,
                    str(cfg),
                )
            if M == 2:  # (the two-row GEMV's: test_gemv_rows_matches_the_product)
                continue
            skinny = K >= 3072
            assert torch.equal(ops.linear(x, w), sg.skinny_gemm(x, w) if skinny else F.linear(x, w))
            want = sg.skinny_gemm_swiglu(x, gate_up) if skinny else ops.swiglu(F.linear(x, gate_up))
            assert torch.equal(ops.linear_swiglu(x, gate_up), want)


def test_gemv_rows_matches_the_product():
    """Two rows: the two-row GEMV (every config of the sweep, plain and with the SwiGLU) against the
    float32 product at Ouro's and Nanbeige's shapes and a ragged one; the engine's ops take it for
    every two-row product."""
    import torch.nn.functional as F

    from rlt.kernels import gemv_rows as gr
    from rlt.models import layers
    from rlt.models.ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(0)
    for N, K in ((6144, 2048), (2048, 5632), (10752, 3072), (3072, 10752), (40, 3100)):
        w, gate_up = (
            (torch.randn(n, K, device="cuda", generator=g) / K**0.5).bfloat16() for n in (N, 2 * N)
        )
        x = torch.randn(2, K, device="cuda", generator=g).bfloat16()
        ref = F.linear(x.float(), w.float())
        ref_swiglu = layers.swiglu(F.linear(x.float(), gate_up.float()))
        for cfg in gr.SWEEP:
            err = (gr.gemv_rows(x, w, cfg).float() - ref).abs().max() / ref.abs().max()
            assert err <= 1e-2, (N, K, str(cfg), err)
            got = gr.gemv_rows_swiglu(x, gate_up, cfg).float()
            err = (got - ref_swiglu).abs().max() / ref_swiglu.abs().max()
            assert err <= 2e-2, (N, K, str(cfg), err)
        assert torch.equal(ops.linear(x, w), gr.gemv_rows(x, w))
        assert torch.equal(ops.linear_swiglu(x, gate_up), gr.gemv_rows_swiglu(x, gate_up))


def test_gemv_epilogues_match_separate_launches():
    """The GEMV finishing the SwiGLU of the [gate; up] projection against the plain GEMV then the
    separate kernel, every config; the residual add + RMSNorm launch (the added row normed or not,
    Ouro's exit gate after it, one row and several) against the torch reference; the models' calls
    (one row: GEMV then that launch) against the reference ops, at Ouro's and Nanbeige's shapes."""
    from rlt.kernels import gemv as gv
    from rlt.kernels.activation import silu_mul
    from rlt.kernels.norm import add_rms_norm
    from rlt.models import layers
    from rlt.models.ops import REFERENCE, TritonOps

    g = torch.Generator(device="cuda").manual_seed(0)
    eps = 1e-6
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        for N, K in ((2048, 2048), (2048, 5632), (37, 300), (2560, 4096)):
            x = torch.randn(1, K, device="cuda", generator=g).to(dtype)
            w, gate_up = (
                (torch.randn(n, K, device="cuda", generator=g) / K**0.5).to(dtype)
                for n in (N, 2 * N)
            )
            r = torch.randn(3, N, device="cuda", generator=g).to(dtype)
            a = torch.randn(3, N, device="cuda", generator=g).to(dtype)
            wa, wo = (
                (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(dtype) for _ in range(2)
            )
            gate_w, gate_b = (
                torch.randn(1, N, device="cuda", generator=g),
                torch.randn(1, device="cuda", generator=g),
            )

            def close(got, ref):
                return (got.float() - ref.float()).abs().max() <= tol * max(
                    1.0, ref.float().abs().max().item()
                )

            for cfg in gv.CONFIGS:
                assert close(gv.gemv_swiglu(x, gate_up, cfg), silu_mul(gv.gemv(x, gate_up, cfg))), (
                    N,
                    K,
                    str(cfg),
                )
            for rows in (1, 3):
                for weight_a in (None, wa):
                    got = add_rms_norm(r[:rows], a[:rows], weight_a, wo, eps, (gate_w, gate_b))
                    ref = layers.add_norm(r[:rows], a[:rows], weight_a, wo, eps)
                    assert got[2].dtype == torch.float32 and got[2].shape == (rows,)
                    assert close(got[0], ref[0]) and close(got[1], ref[1]), (
                        N,
                        rows,
                        weight_a is None,
                    )
                    # the gate's logit from the h this call returns: a long dot product would turn
                    # the
                    # last-bit differences between the two paths' h into more than tol of a logit
                    # near zero
                    assert close(got[2], (got[1].float() @ gate_w.T + gate_b).reshape(-1)), (
                        N,
                        rows,
                    )
                    assert all(
                        torch.equal(p, q)
                        for p, q in zip(
                            got[:2], add_rms_norm(r[:rows], a[:rows], weight_a, wo, eps)
                        )
                    )
            calls = {}
            for kernels, ops in (("triton", TritonOps()), ("reference", REFERENCE)):
                calls[kernels] = (
                    ops.linear_swiglu(x, gate_up),
                    *ops.linear_add_norm(x, w, r[:1], wa, wo, eps, (gate_w, gate_b)),
                )
            (*tri, gate), ref = calls["triton"], calls["reference"]
            # the one-row GEMV and its epilogue ran
            assert torch.equal(tri[0], gv.gemv_swiglu(x, gate_up))
            assert all(
                torch.equal(p, q)
                for p, q in zip(tri[1:], add_rms_norm(r[:1], gv.gemv(x, w), wa, wo, eps))
            )
            assert all(close(p, q) for p, q in zip(tri, ref)), (N, K)
            assert close(gate, (tri[2].float() @ gate_w.T + gate_b).reshape(-1)), (N, K)


def test_qkv_rope_equals_gemv_then_rope():
    """The one-row q/k/v product with RoPE and the K/V store as its epilogue, at Ouro's and Nanbeige's
    shapes in bf16 and float32: q and the cache bit for bit as the GEMV, the split and the RoPE launch."""
    from rlt.kernels import gemv
    from rlt.kernels.qkv_rope import qkv_rope_write_kv
    from rlt.kernels.rope import rope_write_kv
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for H, Hkv, D, K in ((16, 16, 128, 2048), (48, 8, 128, 3072)):
            w = (torch.randn((H + 2 * Hkv) * D, K, device="cuda", generator=g) / K**0.5).to(dtype)
            x = torch.randn(1, K, device="cuda", generator=g).to(dtype)
            pos, slot = torch.tensor([1087], device="cuda"), torch.tensor([77], device="cuda")
            inv = layers.rope_inv_freq(D, 1e6).cuda()
            cache = torch.randn(8, 3, 2, 16, Hkv, D, device="cuda", generator=g).to(dtype)
            caches = [cache.clone(), cache.clone()]
            q, k, v = layers.split_qkv(gemv.gemv(x, w), H, Hkv, D)
            rope_write_kv(q, k, v, pos, inv, False, caches[0], 2, slot, 16)
            got = qkv_rope_write_kv(x, w, (H, Hkv, D), pos, inv, caches[1], 2, slot, 16)
            assert torch.equal(got, q) and torch.equal(*caches), (dtype, H, Hkv)


def test_decode_attention_right_after_the_kv_store():
    """With PDL the decode kernel reads its first key tile before waiting for the RoPE + K/V store
    launched just before it: the newest key, which that launch writes, must still be the new one.
    The cache holds garbage at each row's newest slot until the store; 20 back-to-back pairs."""
    from rlt.kernels.decode_attention import decode_attention
    from rlt.kernels.paged_attention import paged_attention
    from rlt.kernels.rope import rope_write_kv
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    for H, Hkv, D in ((16, 16, 64), (32, 8, 128)):
        cache, meta, tab, _, pos = decode_case(H, Hkv, D, torch.bfloat16, "cuda", layers=20)
        inv = layers.rope_inv_freq(D, 1e4).cuda()
        R = len(pos)
        qkvs = [
            torch.randn(R, (H + 2 * Hkv) * D, device="cuda", generator=g).bfloat16()
            for _ in range(20)
        ]
        views = [layers.split_qkv(t, H, Hkv, D) for t in qkvs]
        blk, off = meta.slot_mapping // meta.block_size, meta.slot_mapping % meta.block_size
        cache[blk, :, :, off] = 1e4  # garbage where the new K/V go
        torch.cuda.synchronize()
        outs = []
        for layer, (q, k, v) in enumerate(views):
            q, k = rope_write_kv(
                q, k, v, pos, inv, False, cache, layer, meta.slot_mapping, meta.block_size
            )
            outs.append(decode_attention(cache, layer, q, tab, pos, meta.block_size))
        torch.cuda.synchronize()
        for layer, (q, _, _) in enumerate(views):
            ref = paged_attention(cache, layer, meta, q, None, None).float()
            assert (outs[layer].float() - ref).abs().max() <= 2e-2 * max(
                1.0, ref.abs().max().item()
            ), (H, layer)


def test_fused_kernels_match_torch():
    """Residual add + RMSNorm and SwiGLU against the torch compositions they replace."""
    import torch.nn.functional as F

    from rlt.kernels.activation import silu_mul
    from rlt.kernels.norm import add_rms_norm
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for N in (2048, 5280, 64):
            x, a = (torch.randn(37, N, device="cuda", generator=g).to(dtype) for _ in range(2))
            wa, wo = (
                (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(dtype) for _ in range(2)
            )
            for w in (wa, None):
                rx = x.cpu().float() + (
                    a.cpu().float()
                    if w is None
                    else layers.rms_norm(a.cpu().float(), w.cpu().float(), 1e-6)
                )
                rh = layers.rms_norm(rx, wo.cpu().float(), 1e-6)
                gx, gh = add_rms_norm(x, a, w, wo, 1e-6)
                assert (gx.float().cpu() - rx).abs().max() <= tol * rx.abs().max()
                assert (gh.float().cpu() - rh).abs().max() <= tol * rh.abs().max()
                # batch-invariant
                assert torch.equal(add_rms_norm(x[3:4], a[3:4], w, wo, 1e-6)[1], gh[3:4])
            gu = torch.randn(37, 2 * N, device="cuda", generator=g).to(dtype)
            gate, up = gu.cpu().float().chunk(2, dim=-1)
            ref = F.silu(gate) * up
            assert (silu_mul(gu).float().cpu() - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("D", [128, 96, 16])
@pytest.mark.parametrize("T", [50, 300])  # a program per head; past FEW_ROWS, per 2 tokens
def test_rope_kernel_matches_torch(pairs, dtype, tol, D, T, monkeypatch):
    from rlt.kernels import rope as rope_kernels
    from rlt.kernels.paged_attention import PagedMetadata, write_kv
    from rlt.kernels.rope import rope_, rope_write_kv
    from rlt.models import layers

    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(T, (8 + 2 * 4) * D, device="cuda", generator=g).to(dtype)
    # strided views, as the models pass
    q, k = qkv[:, : 8 * D].view(T, 8, D), qkv[:, 8 * D : 12 * D].view(T, 4, D)
    pos = torch.randint(0, 60000, (T,), device="cuda", generator=g)
    inv = layers.rope_inv_freq(D, 1e6 if not pairs else 5e4).cuda()
    # adjacent pairs as Huginn's: q and k biased per head first (the add rounded to the dtype)
    qb, kb = (
        torch.randn(n, D, device="cuda", generator=g).to(dtype) if pairs else None for n in (8, 4)
    )
    cpu = lambda t: None if t is None else t.cpu().float()  # noqa: E731
    if pairs:
        ref_q, ref_k = layers.rope(cpu(q + qb), cpu(k + kb), pos.cpu(), inv.cpu(), True)
    else:
        ref_q, ref_k = layers.rope(cpu(q), cpu(k), pos.cpu(), inv.cpu(), False)
    v = qkv[:, 12 * D :].clone()
    qkv2, qkv3 = qkv.clone(), qkv.clone()
    got_q, got_k = rope_(q, k, pos, inv, pairs, qb, kb)
    assert (got_q.float().cpu() - ref_q).abs().max() <= tol * ref_q.abs().max()
    assert (got_k.float().cpu() - ref_k).abs().max() <= tol * ref_k.abs().max()
    assert torch.equal(qkv[:, 12 * D :], v)  # v beside q and k in the projection is untouched
    # the same launch storing k and v into the paged cache: same q/k bits, the cache as write_kv
    # leaves it
    cache, ref_cache, cache3 = (
        torch.zeros(32, 2, 2, 16, 4, D, dtype=dtype, device="cuda") for _ in range(3)
    )
    slots = torch.randperm(32 * 16, device="cuda", generator=g)[:T]
    split = lambda x: (
        x[:, : 8 * D].view(T, 8, D),
        x[:, 8 * D : 12 * D].view(T, 4, D),
        x[:, 12 * D :].view(T, 4, D),
    )  # noqa: E731
    q2, k2, v2 = split(qkv2)
    rope_write_kv(q2, k2, v2, pos, inv, pairs, cache, 1, slots, 16, qb, kb)
    write_kv(ref_cache, 1, PagedMetadata(slots, None, [], [], 16), got_k, v.view(T, 4, D))
    assert torch.equal(q2, got_q) and torch.equal(k2, got_k) and torch.equal(cache, ref_cache)
    if T > rope_kernels.FEW_ROWS:  # the tokens kernel's bits are the per-head kernel's
        monkeypatch.setattr(rope_kernels, "FEW_ROWS", T)
        rope_write_kv(*split(qkv3), pos, inv, pairs, cache3, 1, slots, 16, qb, kb)
        assert torch.equal(qkv3, qkv2) and torch.equal(cache3, cache)


def test_rms_norm_on_cuda_matches_torch():
    from rlt.models import layers
    from rlt.models.ops import TritonOps

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 5280, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(5280, device="cuda", generator=g)).bfloat16()
    ref = layers.rms_norm(x.cpu().float(), w.cpu().float(), 1e-6)
    assert (
        TritonOps().rms_norm(x, w, 1e-6).float().cpu() - ref
    ).abs().max() <= 2e-2 * ref.abs().max()


@pytest.mark.parametrize("lanes,layers,heads,dim", [(1, 3, 4, 16), (64, 4, 55, 96)])
def test_finalize_copies_on_cuda_match_torch(lanes, layers, heads, dim):
    """The finalize copies' kernel: exactly the kept lanes' and planes' slots move (every layer, K
    and V), one lane (Ouro's one-row steady decode) and 64 at Huginn's width."""
    from rlt.kernels import kv_copy, kv_copy_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    P, W, D, bs = 33, 4, 32, 16
    blocks = lanes * P * W
    cache = torch.randn(
        blocks + 1, layers, 2, bs, heads, dim, device="cuda", generator=g
    ).bfloat16()
    tables = torch.randperm(blocks, device="cuda", generator=g).view(lanes, P, W)
    pos = torch.randint(0, W * bs, (lanes,), device="cuda", generator=g)
    depth = torch.randint(1, D + 1, (lanes,), device="cuda", generator=g)
    done = torch.rand(lanes, device="cuda", generator=g) < 0.5
    done[0] = True
    want, got = cache.clone(), cache.clone()
    kv_copy.finalize_copies(want, tables, pos, depth.clamp(max=D - 1), done, D, blocks * bs)
    kv_copy_triton.finalize_copies(got, tables, pos, depth.clamp(max=D - 1), done, D, blocks * bs)
    assert torch.equal(got[:-1], want[:-1]) and not torch.equal(got, cache)


def test_lane_rows_on_cuda_match_torch():
    """Steady decode's attention rows at 64 lanes, 33 planes: the torch reference's tables, slots and
    positions (planes clamped, lanes on and off, positions past the last block)."""
    from rlt.kernels import lane_rows, lane_rows_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    L, P, W = 64, 33, 48
    tables = torch.randperm(L * P * W, device="cuda", generator=g).view(L, P, W)
    plane = torch.randint(0, P, (L,), device="cuda", generator=g)
    pos = torch.randint(0, W * 16 + 40, (L,), device="cuda", generator=g)
    table_on, slot_on = (torch.rand(L, device="cuda", generator=g) < 0.7 for _ in range(2))
    for max_plane in (0, 31, 32):
        args = (tables, plane, max_plane, pos, table_on, slot_on, L * P * W, 16)
        want, got = lane_rows.lane_rows(*args), lane_rows_triton.lane_rows(*args)
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_latent_checks_on_cuda_match_torch():
    """Steady decode's fused bookkeeping and latent checks at Huginn's width, 64 lanes: the torch
    reference's states, depths, previous states, parking and counts."""
    from rlt.kernels import lane_checks, lane_checks_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    L, H = 64, 5280

    def ints(lo, hi):
        return torch.randint(lo, hi, (L,), device="cuda", generator=g)

    out, x = (torch.randn(L, H, device="cuda", generator=g).bfloat16() for _ in range(2))
    noise = torch.randn(L, H, device="cuda", generator=g)
    prev_diff = out.float() + torch.rand(L, 1, device="cuda", generator=g) * noise
    prev_cos = out.float() + 0.1 * torch.randn(L, H, device="cuda", generator=g)
    thr = torch.rand(L, device="cuda", generator=g) * torch.where(ints(1, 3) == 1, 2.0, 0.01)
    run, parked = ints(0, 4) > 0, ints(0, 8) == 0
    want = [
        out,
        x,
        run,
        ints(0, 31),
        ints(0, 3),
        ints(1, 4),
        ints(20, 33),
        thr,
        prev_diff,
        prev_cos,
        parked & ~run,
    ]
    want.append(ints(0, 10) > 0)  # active
    got = [t.clone() for t in want]
    counts = lane_checks.latent_checks(*want), lane_checks_triton.latent_checks(*got)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and torch.equal(*counts)
    assert 0 < counts[0][1] < L  # some lanes parked, some not
