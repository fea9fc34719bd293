"""Runs Triton kernels on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set by
test_kernels_interpreted.py before triton is imported) against the torch references, so CI checks
kernel logic without a GPU. Prints one line per check; exits non-zero on a mismatch."""

import sys

import numpy as np
import torch
import triton.runtime.interpreter as interpreter
from kernel_cases import decode_case

# Triton 3.6's interpreter turns a loaded scalar into int() of a 1-element array, which NumPy 2
# refuses: index it instead (test-only; the compiled kernels never run this code).
_patch = interpreter._patch_lang_tensor


def _patch_index(tensor, scope):
    _patch(tensor, scope)
    scope.set_attr(
        tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])
    )


interpreter._patch_lang_tensor = _patch_index


def check_decode_attention() -> bool:
    from rlt.kernels.decode_attention import decode_attention
    from rlt.kernels.paged_attention import paged_attention

    ok = True
    for H, Hkv, D in ((2, 2, 16), (4, 2, 16), (3, 1, 8)):  # MHA, GQA (a padded group)
        cache, meta, tab, q, pos = decode_case(H, Hkv, D, torch.float32, "cpu", layers=1)
        ref = paged_attention(cache, 0, meta, q, None, None)
        for splits in (1, 4):
            err = (
                (decode_attention(cache, 0, q, tab, pos, meta.block_size, splits) - ref)
                .abs()
                .max()
                .item()
            )
            print(f"decode_attention H={H} Hkv={Hkv} D={D} splits={splits}: max error {err:.2e}")
            ok &= err <= 1e-5
    return ok


def check_paged_attention() -> bool:
    """The general kernel (passes with prompt chunks): a prompt chunk after a prefix, a first chunk,
    a decode row and a few rows after a long prefix in one launch, in tiles of 16 rows, then in
    tiles of 64 with each tile's keys split into slices merged by the last one to finish, then with
    the segments shorter than a tile in a second launch, a GQA group's heads packed into its items'
    rows (beside tiles of one head, alone, keys split)."""
    from rlt.kernels.paged_attention import (
        KernelPlan,
        PagedMetadata,
        kernel_fields,
        paged_attention,
        plan_kernel,
    )
    from rlt.kernels.paged_attention_triton import _queue, _scratch
    from rlt.kernels.paged_attention_triton import paged_attention as triton_paged

    g = torch.Generator().manual_seed(0)
    H, Hkv, D, bs = 4, 2, 16, 4
    segs = [(6, 20), (0, 9), (30, 1), (300, 5)]  # (first position, rows)
    tables, nxt = [], 0
    for q0, n in segs:
        nb = -(-(q0 + n) // bs)
        tables.append(list(range(nxt, nxt + nb)))
        nxt += nb
    tab = torch.zeros(len(segs), max(map(len, tables)), dtype=torch.int64)
    for i, t in enumerate(tables):
        tab[i, : len(t)] = torch.tensor(t)
    cache = torch.randn(nxt, 1, 2, bs, Hkv, D, generator=g)
    row_starts = np.cumsum([0] + [n for _, n in segs]).tolist()
    q_starts = [q0 for q0, _ in segs]
    # q as the model hands it over: a view of the fused q/k/v projection (rows strided)
    q = torch.randn(row_starts[-1], (H + 2 * Hkv) * D, generator=g)[:, : H * D].view(-1, H, D)
    ref = paged_attention(
        cache, 0, PagedMetadata(None, tab, row_starts, q_starts, bs), q, None, None
    )
    split = plan_kernel(row_starts, q_starts, False, fill_tiles=64)
    # 4 tiles: the 305 keys in 5 slices of 64
    assert (split.tile_rows, split.max_splits) == (64, 16), split
    # most keys first
    assert kernel_fields(row_starts, q_starts, split)["tile_seg"].tolist() == [3, 2, 0, 1]
    # segments shorter than a tile in a second launch, a GQA group's 2 heads per item: beside tiles
    # of 16 rows, then every segment packed (tiles of 64: 32 rows of 2 heads), keys split, then both
    # split
    packed = plan_kernel(row_starts, q_starts, False, fill_tiles=64, pack=2)
    assert (packed.tile_rows, packed.packed_rows, packed.packed_splits) == (64, 32, 16), packed
    assert len(kernel_fields(row_starts, q_starts, packed)["tile_seg"]) == 0
    both = KernelPlan(16, fill_tiles=64, max_splits=16, pack=2, packed_splits=16)
    ok = True
    plans = (
        ("tiles of 16", KernelPlan()),
        ("keys split", split),
        ("2 heads", KernelPlan(16, pack=2)),
    )
    for name, plan in plans + (("2 heads, keys split", packed), ("both split", both)):
        fields = {
            k: torch.from_numpy(a) for k, a in kernel_fields(row_starts, q_starts, plan).items()
        }
        err = (triton_paged(cache, 0, q, tab, fields, bs, plan) - ref).abs().max().item()
        print(
            f"paged_attention (prompt chunks, a decode row, a long prefix; {name}): max error {err:.2e}"
        )
        ok &= err <= 1e-5
    cpu = torch.device("cpu")
    counters = {
        _scratch(cpu, p.split_items * H * p.tile_rows, 16)[2] for p in (split, packed, both)
    }
    left = sum(int(c.abs().sum()) for c in counters) + int(_queue(cpu).abs().sum())
    print(f"split arrival counters and work queue left nonzero: {left}")
    return ok and left == 0


def check_pass_graph_inputs() -> bool:
    """A pass graph's integer inputs as PassGraphs.inputs lays them out (no CUDA: the host side
    alone), read through the same views a captured graph holds and run by the general kernel with
    the graph's plan: a long chunk in tiles of one head, decode rows and a short chunk packed, both
    lists' keys split; padding tiles on the empty segment, padding rows past the pass's."""
    from types import SimpleNamespace

    from rlt.kernels.paged_attention import KernelPlan, PagedMetadata, paged_attention
    from rlt.kernels.paged_attention_triton import paged_attention as triton_paged
    from rlt.workers.cuda_graphs import _PASS_INPUTS, PassGraphs

    g = torch.Generator().manual_seed(3)
    H, Hkv, D, bs = 4, 2, 16, 4
    segs = [(0, 70), (100, 1), (37, 1), (8, 20)]  # (first position, rows)
    tables, nxt = [], 1  # (block 0: the scratch block)
    for q0, n in segs:
        tables.append(list(range(nxt, nxt + -(-(q0 + n) // bs))))
        nxt += len(tables[-1])
    cache = torch.randn(nxt, 1, 2, bs, Hkv, D, generator=g)
    row_starts = np.cumsum([0] + [n for _, n in segs]).tolist()
    q_starts = [q0 for q0, _ in segs]
    pos = np.concatenate([np.arange(q0, q0 + n) for q0, n in segs])
    q = torch.randn(row_starts[-1], H, D, generator=g)
    graphs = PassGraphs.__new__(PassGraphs)  # (its CUDA-free fields)
    graphs.pool, graphs.buckets = SimpleNamespace(block_size=bs, scratch_block=0), [16, 32, 64, 128]
    graphs.plan, graphs.tile_rows, graphs.scratch_slot = KernelPlan(64, fill_tiles=8, pack=2), 64, 0
    (R, W), ints = graphs.inputs(pos, tables, row_starts, q_starts)
    at, ints = graphs._layout(R, W), torch.from_numpy(ints)
    plan = graphs._plan(R)
    kernel = {name: ints[at[name]] for name in _PASS_INPUTS[2:-1]}
    # (key slices: tiles x slices within twice the tiles filling the GPU, a power of two)
    assert kernel["work"].tolist() == [8, 2] and kernel["packed_work"].tolist() == [8, 3], kernel[
        "work"
    ]
    table = ints[at["table"]].view(-1, W)
    slots = torch.tensor(
        [t[p // bs] * bs + p % bs for (q0, n), t in zip(segs, tables) for p in range(q0, q0 + n)]
    )
    ok = torch.equal(graphs.slots((R, W), ints, len(pos)), slots)
    ref = paged_attention(
        cache, 0, PagedMetadata(None, table, row_starts, q_starts, bs), q, None, None
    )
    err = (triton_paged(cache, 0, q, table, kernel, bs, plan) - ref).abs().max().item()
    print(
        f"pass graph inputs (a long chunk, decode rows and a short chunk packed): max error {err:.2e}"
    )
    return ok and err <= 1e-5


def check_gemv() -> bool:
    from rlt.kernels import gemv as gv

    g = torch.Generator().manual_seed(0)
    # ragged N, K
    cases = [(torch.randn(1, k, generator=g), torch.randn(37, k, generator=g)) for k in (300, 2100)]
    ok = True
    for cfg in gv.CONFIGS:
        err = max(
            (gv.gemv(x, w, cfg) - x @ w.T).abs().max().item() / (x @ w.T).abs().max().item()
            for x, w in cases
        )
        print(f"gemv {cfg}: max error {err:.2e} (relative)")
        ok &= err <= 1e-5
    # a loop after 3 early tiles
    cases.append((torch.randn(1, 4200, generator=g), torch.randn(37, 4200, generator=g)))
    for early in (2, 3):  # K tiles read before the wait (capped at K's)
        err = max(
            (gv.gemv(x, w, early_tiles=early) - x @ w.T).abs().max().item()
            / (x @ w.T).abs().max().item()
            for x, w in cases
        )
        print(f"gemv {gv.CONFIG}, {early} early tiles: max error {err:.2e} (relative)")
        ok &= err <= 1e-5
    return ok


def check_gemv_epilogues() -> bool:
    """The GEMV finishing the SwiGLU of [gate; up] against the separate steps, every config, K in 1 to
    3 tiles."""
    from rlt.kernels import gemv as gv
    from rlt.models import layers

    g = torch.Generator().manual_seed(1)
    N = 37
    cases = [
        (torch.randn(1, K, generator=g), torch.randn(2 * N, K, generator=g)) for K in (300, 2100)
    ]  # x, [gate; up]

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    ok = True
    for cfg in gv.CONFIGS:
        err = max(
            rel(gv.gemv_swiglu(x, gate_up, cfg), layers.swiglu(x @ gate_up.T))
            for x, gate_up in cases
        )
        print(f"gemv swiglu {cfg}: max error {err:.2e} (relative)")
        ok &= err <= 1e-5
    return ok


def check_gemv_rows() -> bool:
    """The two-row GEMV, plain and with the SwiGLU, ragged N and K over 1 and 3 tiles (9 of 256),
    x's rows strided, against the float32 product: the engine's config (a row of w a program) and
    one of four rows of w a program (the GPU test takes every config of the sweep)."""
    from rlt.kernels import gemv_rows as gr
    from rlt.models import layers

    g = torch.Generator().manual_seed(2)
    N, errs = 9, []  # (w: 18 rows, ragged for four a program)
    for K in (300, 2100):
        x = torch.randn(2, K + 8, generator=g)[:, :K]  # (a row stride past K)
        w = torch.randn(2 * N, K, generator=g)
        for cfg in (gr.CONFIG, gr.GemvConfig(4, 256, 4)):
            for got, ref in (
                (gr.gemv_rows(x, w, cfg), x @ w.T),
                (gr.gemv_rows_swiglu(x, w, cfg), layers.swiglu(x @ w.T)),
            ):
                errs.append(((got - ref).abs().max() / ref.abs().max()).item())
    print(f"gemv rows: max error {max(errs):.2e} (relative)")
    return max(errs) <= 1e-5


def check_rope_write_kv() -> bool:
    from rlt.kernels.paged_attention import PagedMetadata, write_kv
    from rlt.kernels.rope import rope_write_kv
    from rlt.models import layers

    g = torch.Generator().manual_seed(0)
    ok = True
    # (over FEW_ROWS rows a program takes a block of heads: 20 + 2 x 4 heads, two blocks)
    for pairs, H, Hkv, T in (
        (False, 4, 2, 5),
        (True, 4, 2, 5),
        (False, 20, 4, 260),
        (True, 20, 4, 260),
    ):
        D, bs = 8, 4
        qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g)
        q, k, v = (
            qkv[:, a * D : b * D].view(T, b - a, D)
            for a, b in ((0, H), (H, H + Hkv), (H + Hkv, H + 2 * Hkv))
        )
        pos = torch.tensor([0, 3, 7, 100, 5] * (T // 5))
        inv = layers.rope_inv_freq(D, 1e4)
        slots = torch.randperm(T, generator=g)
        # adjacent pairs as Huginn's: q and k biased per head first
        qb, kb = (torch.randn(n, D, generator=g) if pairs else None for n in (H, Hkv))
        ref_q, ref_k = layers.rope(q, k, pos, inv, pairs, qb, kb)
        ref_cache = torch.zeros(-(-T // bs), 2, 2, bs, Hkv, D)
        write_kv(ref_cache, 1, PagedMetadata(slots, None, [], [], bs), ref_k, v)
        cache = torch.zeros_like(ref_cache)
        got_q, got_k = rope_write_kv(q, k, v, pos, inv, pairs, cache, 1, slots, bs, qb, kb)
        err = max(
            (got_q - ref_q).abs().max().item(),
            (got_k - ref_k).abs().max().item(),
            (cache - ref_cache).abs().max().item(),
        )
        print(f"rope_write_kv pairs={pairs} (biased: {pairs}) heads {H}/{Hkv}: max error {err:.2e}")
        ok &= err <= 1e-5 and got_q.data_ptr() == q.data_ptr()  # rotated in place
    return ok


def check_qkv_rope() -> bool:
    """The one-row q/k/v product with RoPE and the K/V store as its epilogue against the GEMV, the
    split and the RoPE + store launch: q and the cache equal bit for bit (GQA and MHA; K of 1 and 3
    tiles)."""
    from rlt.kernels import gemv
    from rlt.kernels.qkv_rope import qkv_rope_write_kv
    from rlt.kernels.rope import rope_write_kv
    from rlt.models import layers

    g = torch.Generator().manual_seed(3)
    ok = True
    for H, Hkv, K in ((4, 2, 300), (2, 2, 2100)):
        D, bs = 16, 4
        w, x = (
            torch.randn((H + 2 * Hkv) * D, K, generator=g) / K**0.5,
            torch.randn(1, K, generator=g),
        )
        pos, slot, inv = torch.tensor([37]), torch.tensor([9]), layers.rope_inv_freq(D, 1e4)
        cache = torch.randn(4, 2, 2, bs, Hkv, D, generator=g)
        caches = [cache.clone(), cache.clone()]
        q, k, v = layers.split_qkv(gemv.gemv(x, w), H, Hkv, D)
        rope_write_kv(q, k, v, pos, inv, False, caches[0], 1, slot, bs)
        got = qkv_rope_write_kv(x, w, (H, Hkv, D), pos, inv, caches[1], 1, slot, bs)
        same = torch.equal(got, q) and torch.equal(*caches)
        print(f"qkv_rope_write_kv heads {H}/{Hkv}, K {K}: equal to gemv + rope_write_kv: {same}")
        ok &= same
    return ok


def check_norms() -> bool:
    """RMSNorm alone and after the residual add (the added rows normed or not; with Ouro's exit gate
    on the normed rows), rows of a ragged length, against the torch steps of rlt/models/layers.py."""
    from rlt.kernels.norm import add_rms_norm, rms_norm
    from rlt.models import layers

    g = torch.Generator().manual_seed(2)
    x, a = torch.randn(3, 37, generator=g), torch.randn(3, 37, generator=g)
    wa, wo = 1 + 0.1 * torch.randn(37, generator=g), 1 + 0.1 * torch.randn(37, generator=g)
    err = (rms_norm(x, wo, 1e-6) - layers.rms_norm(x, wo, 1e-6)).abs().max().item()
    gate_w, gate_b = torch.randn(1, 37, generator=g), torch.randn(1, generator=g)
    for weight_a in (None, wa):
        got = add_rms_norm(x, a, weight_a, wo, 1e-6, (gate_w, gate_b))
        ref = layers.add_norm(x, a, weight_a, wo, 1e-6)
        ref = (*ref, (ref[1] @ gate_w.T + gate_b).reshape(-1))
        err = max(err, *((g - r).abs().max().item() for g, r in zip(got, ref)))
    print(f"rms_norm, add_rms_norm (+ exit gate): max error {err:.2e}")
    return err <= 1e-5


def check_penalty_slots() -> bool:
    """The penalty kernels against their torch references on the same slots: penalizing rows (long
    lists past one block, a one-token list, rows not in order), then appending sampled tokens,
    kept everywhere or only where a lane exited (new tokens listed, known ones counted)."""
    from rlt.kernels import penalties as ref
    from rlt.kernels import penalties_triton as tri

    g = torch.Generator().manual_seed(5)
    S, V, L = 4, 700, 600
    counts = torch.zeros(S, V, dtype=torch.int32)
    tokens = torch.zeros(S, L, dtype=torch.int32)
    length = torch.tensor([300, 1, 2, 17], dtype=torch.int32)  # (>= 1: a prompt lists a token)
    for s, n in enumerate(length.tolist()):
        listed = torch.randperm(V, generator=g)[:n]
        tokens[s, :n] = listed.to(torch.int32)
        own = torch.randint(0, 4, (n,), generator=g) + ref.PROMPT * (listed % 2)
        # (listed: in the prompt or output)
        counts[s, listed] = torch.where(own == 0, 1, own).to(torch.int32)
    rows, slots = torch.tensor([2, 0, 1]), torch.tensor([0, 3, 2])
    r, f, p = (
        torch.tensor([1.3, 0.8, 2.0]),
        torch.tensor([0.5, -0.3, 0.0]),
        torch.tensor([0.25, 1.0, -0.5]),
    )
    x = 3 * torch.randn(3, V, generator=g)
    want, got = x.clone(), x.clone()
    ref.penalize_slots(want, rows, slots, r, f, p, tokens, counts, length, L)
    tri.penalize_slots(got, rows, slots, r, f, p, tokens, counts, length, ref.PROMPT)
    err = (got - want).abs().max().item()
    print(f"penalize_slots: max error {err:.2e}")
    ok = err == 0 and not torch.equal(got, x)
    worst = 0
    for keep in (None, torch.tensor([True, False, True])):
        # listed, -, new
        sampled = torch.stack([tokens[0, 5].long(), torch.tensor(3), torch.tensor(699)])
        state = [(t.clone(), c.clone(), n.clone()) for t, c, n in [(tokens, counts, length)] * 2]
        ref.append_slots(sampled, keep, rows, slots, *state[0])
        tri.append_slots(sampled, keep, rows, slots, *state[1])
        (t0, c0, n0), (t1, c1, n1) = state
        worst = max(worst, (c0 - c1).abs().max().item(), (n0 - n1).abs().max().item())
        worst = max(
            worst,
            max((t0[s, : n0[s]] - t1[s, : n1[s]]).abs().max().item() for s in range(S) if n0[s]),
        )
        ok &= not torch.equal(c0, counts)
    print(f"append_slots: max error {worst:.2e}")
    return ok and worst == 0


def check_kv_copy() -> bool:
    """The finalize copies: the Triton kernel moves exactly the kept lanes' and planes' slots (every
    layer, K and V), as the reference does outside its scratch slot; one lane and several."""
    from rlt.kernels import kv_copy, kv_copy_triton

    g = torch.Generator().manual_seed(3)
    err, moved = 0.0, True
    for L in (1, 4):
        P, W, D, bs = 5, 3, 4, 4  # tables: 4 core planes and a boundary one, 3 blocks wide
        blocks = L * P * W
        cache = torch.randn(blocks + 1, 3, 2, bs, 5, 12, generator=g)  # the last block: scratch
        tables = torch.randperm(blocks, generator=g).view(L, P, W)
        pos = torch.tensor([9, 2, 11, 5][:L])
        # (the third lane, done at full depth, copies nothing)
        depth = torch.tensor([2, 1, 4, 3][:L])
        done = torch.tensor([True, True, True, False][:L])
        want, got = cache.clone(), cache.clone()
        kv_copy.finalize_copies(want, tables, pos, depth, done, D, blocks * bs)
        kv_copy_triton.finalize_copies(got, tables, pos, depth, done, D, blocks * bs)
        err = max(err, (got[:-1] - want[:-1]).abs().max().item())
        moved &= not torch.equal(want[:-1], cache[:-1]) and torch.equal(got[-1], cache[-1])
    print(f"finalize_copies: max error {err:.2e}")
    return err == 0 and moved


def check_lane_rows() -> bool:
    """Steady decode's attention rows against their torch reference: planes past max_plane clamped,
    tables and slots on or off per lane, a position past the table's last block (clamped)."""
    from rlt.kernels import lane_rows, lane_rows_triton

    g = torch.Generator().manual_seed(2)
    tables = torch.randperm(4 * 5 * 7, generator=g).view(4, 5, 7)
    plane, pos = torch.tensor([0, 4, 2, 9]), torch.tensor([3, 17, 40, 200])
    table_on = torch.tensor([True, True, False, True])
    slot_on = torch.tensor([True, False, False, True])
    args = (tables, plane, 3, pos, table_on, slot_on, 140, 16)
    want, got = lane_rows.lane_rows(*args), lane_rows_triton.lane_rows(*args)
    err = max((a - b).abs().max().item() for a, b in zip(want, got))
    print(f"lane_rows: max error {err:.2e}")
    return err == 0 and want[2].tolist() == [3, 0, 0, 200] and want[1][1].item() == 140 * 16


def check_latent_checks() -> bool:
    """Steady decode's fused bookkeeping and latent checks against their torch reference: lanes that
    run or not, each criterion held or not, checked or not (min_loops), at max_loops, ended, a zero
    previous state (cosine: never an exit)."""
    from rlt.kernels import lane_checks, lane_checks_triton

    g = torch.Generator().manual_seed(1)
    L, H = 9, 37
    out, x = torch.randn(L, H, generator=g).bfloat16(), torch.randn(L, H, generator=g).bfloat16()
    run = torch.tensor([1, 1, 1, 1, 1, 0, 1, 1, 0], dtype=torch.bool)
    depth = torch.tensor([0, 3, 4, 7, 2, 5, 9, 1, 0])
    crit = torch.tensor([1, 1, 2, 2, 0, 1, 2, 1, 2])
    lo, hi = (
        torch.tensor([1, 1, 1, 8, 1, 1, 1, 3, 1]),
        torch.tensor([32, 32, 32, 32, 3, 32, 10, 32, 32]),
    )
    thr = torch.tensor([0.5, 0.1, 0.01, 0.5, 0.3, 0.9, 0.02, 2.0, 0.5])
    prev_diff = out.float() + 0.3 * torch.randn(L, H, generator=g)
    prev_cos = out.float() + 0.05 * torch.randn(L, H, generator=g)
    prev_cos[8] = 0
    parked = torch.tensor([0, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    active = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0], dtype=torch.bool)
    want = [out, x, run, depth, crit, lo, hi, thr, prev_diff, prev_cos, parked, active]
    got = [t.clone() for t in want]
    counts = lane_checks.latent_checks(*want), lane_checks_triton.latent_checks(*got)
    err = max((a.float() - b.float()).abs().max().item() for a, b in zip(want, got))
    print(
        f"latent_checks: max error {err:.2e}, parked {want[10].tolist()}, counts {counts[0].tolist()}"
    )
    varied = want[10].tolist() == [True, False, True, True, True, True, True, False, False]
    return err == 0 and torch.equal(*counts) and varied


def check_random_bits() -> bool:
    from rlt.kernels.random import random_bits
    from rlt.kernels.random_triton import random_bits_rows

    seed = torch.tensor([0, 7, -1, -(2**62) + 5, 2**40 + 3, 123456789])
    counter = torch.tensor([0, 1, 2**32 + 9, 2**33, 5, 2**31 - 1])
    ok = True
    for stream in (1, 2):
        ref = random_bits(
            seed.unsqueeze(1), stream, counter.unsqueeze(1), torch.arange(1500).unsqueeze(0)
        )
        got = random_bits_rows(seed, stream, counter, 1500)
        ok &= torch.equal(ref, got)
        print(f"random_bits_rows stream {stream}: equal to the reference: {torch.equal(ref, got)}")
    return ok


if __name__ == "__main__":
    checks = (
        check_decode_attention,
        check_paged_attention,
        check_pass_graph_inputs,
        check_gemv,
        check_gemv_epilogues,
        check_gemv_rows,
        check_rope_write_kv,
        check_qkv_rope,
        check_norms,
        check_penalty_slots,
        check_kv_copy,
        check_lane_rows,
        check_latent_checks,
        check_random_bits,
    )
    sys.exit(0 if all([check() for check in checks]) else 1)
