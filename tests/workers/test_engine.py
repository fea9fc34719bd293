"""The paged loop-level engine: equal to the references, batch invariant, every block returned."""

import pytest
import torch

from rlt import RequestError
from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.kernels.random import truncated_normal
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine
from tests.reference import Ref, ref_generate, shared_generate
from tests.workers.helpers import PROMPTS, make, mixed_params, run


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_batch_invariance(checkpoints, family, layout):
    mc, new_engine = make(checkpoints[family], family, layout)
    reqs = {str(i): (p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, mixed_params(family)))}
    together = run(new_engine(), mc, reqs, arrivals={"0": 0, "1": 3, "2": 7})
    for rid, req in reqs.items():
        alone = run(new_engine(), mc, {rid: req})[rid]
        assert [o[:2] for o in together[rid]] == [o[:2] for o in alone], rid
        for a, b in zip(together[rid], alone):
            if a[2]:
                assert a[2].keys() == b[2].keys()
                assert max(abs(a[2][t] - b[2][t]) for t in a[2]) < 1e-4  # float32 GEMM order
    if family == "ouro":
        assert len({d for o in together["0"][1:] for d in [o[1]]}) >= 2  # exits really vary


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_chunked_prefill_equals_unchunked(checkpoints, family):
    mc, new_engine = make(checkpoints[family], family)
    reqs = {str(i): (p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, mixed_params(family)))}
    whole = run(new_engine(prefill_chunk=1000), mc, reqs)
    for chunk in (1, 3):
        assert {
            r: [o[:2] for o in v] for r, v in run(new_engine(prefill_chunk=chunk), mc, reqs).items()
        } == {r: [o[:2] for o in v] for r, v in whole.items()}


def passes(engine, what) -> list:
    """What each of the engine's passes carried, as what(groups) gives it (a spy on its runner)."""
    seen, step = [], engine.runner.step

    def recorded(groups):
        seen.append(what(groups))
        return step(groups)

    engine.runner.step = recorded
    return seen


@pytest.mark.parametrize("max_num_seqs, pass_rows", [(5, 12), (10, 24)])
def test_prompts_chunked_to_the_decode_pass_budget(checkpoints, max_num_seqs, pass_rows):
    """While more than half of max_num_seqs streams decode, a pass carries at most decode_pass_rows
    rows (the streams' next tokens first, a prompt chunked into the rest); while at most half do, its
    first prompt may take twice that; a prompt alone takes its whole chunk; tokens and depths are
    those of an unbounded pass."""
    mc, new_engine = make(
        checkpoints["ouro"],
        "ouro",
        prefill_chunk=64,
        max_num_batched_tokens=64,
        max_num_seqs=max_num_seqs,
    )
    sp = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    reqs = {i: ([3 + i, 9, 27, 81, 5], sp) for i in range(4)} | {
        9: ([(i * 13) % 500 + 3 for i in range(40)], sp)
    }
    arrivals = {9: 10}  # the long prompt comes while the four stream

    def rows(groups):  # prompt rows, decode rows
        return sum(g.n for g in groups if not g.decoding), sum(g.n for g in groups if g.decoding)

    bounded = new_engine(decode_pass_rows=12)
    seen = passes(bounded, rows)
    out = run(bounded, mc, reqs, arrivals)
    assert (
        max(p + d for p, d in seen if d == 4) == pass_rows
        and max(p for p, d in seen if d == 4) == pass_rows - 4
    )
    # every prompt row once per loop
    assert sum(p for p, _ in seen) == 4 * 5 * mc.depth + 40 * mc.depth
    unbounded = new_engine()
    seen = passes(unbounded, rows)
    assert run(unbounded, mc, reqs, arrivals) == out
    assert max(p for p, d in seen if d) == 40

    alone = new_engine(decode_pass_rows=12)
    seen = passes(alone, rows)
    run(alone, mc, {9: reqs[9]})
    assert seen[0] == (40, 0)


def test_one_prompt_per_pass_past_the_decode_pass_budget(checkpoints):
    """While few streams decode, a pass's first prompt may go past decode_pass_rows (up to twice it
    here: 4 of max_num_seqs 10 decode), the others share what decode_pass_rows leaves: two short
    prompts arriving together enter the loop whole, in different passes; tokens and depths are
    those of an unbounded pass."""
    mc, new_engine = make(
        checkpoints["ouro"], "ouro", prefill_chunk=64, max_num_batched_tokens=64, max_num_seqs=10
    )
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    reqs = {i: ([3 + i, 9, 27, 81, 5], sp) for i in range(4)}
    reqs |= {i: ([(j * 13 + i) % 500 + 3 for j in range(10)], sp) for i in (8, 9)}
    arrivals = {8: 10, 9: 10}  # together, while the four stream

    def entering(groups):  # rows, decode rows, and the prompt chunks entering the loop
        new = [g.n for g in groups if not g.decoding and g.depth == 0]
        return sum(g.n for g in groups), sum(g.decoding for g in groups), new

    bounded = new_engine(decode_pass_rows=12)
    seen = passes(bounded, entering)
    out = run(bounded, mc, reqs, arrivals)
    late = [new for rows, decoding, new in seen if decoding == 4 and new]
    # whole, one a pass (12 - 4 rows left for the second: none once the first took 10)
    assert late == [[10], [10]]
    assert max(rows for rows, decoding, _ in seen if decoding) <= 24
    assert run(new_engine(), mc, reqs, arrivals) == out


def noise_fn(ref, seed):
    s = ref.cfg["init_values"]["std"] * ref.cfg["init_values"]["embed_scale"]
    return lambda T: (
        truncated_normal(torch.tensor(seed), torch.arange(T)[:, None], torch.arange(ref.H)[None, :])
        * s
    )


CASES = [
    ("ouro", {}, {}),
    ("ouro", {}, dict(exit_threshold=0.5)),
    ("ouro", {}, dict(exit_threshold=0.4, min_loops=2, max_loops=3)),
    ("nanbeige", {}, {}),
    ("nanbeige", {}, dict(max_loops=1)),
    ("huginn", {"mean_recurrence": 5, "state_init": "zero"}, {}),
    ("huginn", {"mean_recurrence": 5}, dict(seed=11, max_loops=3)),
]


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family,overrides,kw", CASES)
def test_engine_equals_dense_reference(checkpoints, family, overrides, kw, layout):
    """last_exited: the whole-sequence reference reading version min(d, e); shared: the
    position-by-position reference reading every earlier position's final K/V."""
    mc, new_engine = make(checkpoints[family], family, layout, overrides)
    prompt = PROMPTS[0]
    sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5, **kw)
    got = run(new_engine(), mc, {"a": (prompt, sp)})["a"]
    ref = Ref(checkpoints[family], overrides)
    noise = (
        noise_fn(ref, kw["seed"])
        if family == "huginn" and overrides.get("state_init") != "zero"
        else None
    )
    args = (
        ref,
        prompt,
        8,
        kw.get("min_loops", 1),
        kw.get("max_loops"),
        kw.get("exit_threshold", 1.0),
        noise,
    )
    tokens, depths, logps = (ref_generate if layout == "last_exited" else shared_generate)(*args)
    assert [o[0] for o in got] == tokens
    assert [o[1] for o in got] == depths
    # float32 against a float64 reference; Huginn's many sandwich norms accumulate more rounding
    # (measured up to 2.7e-4 under SHARED), within the 1e-3 parity budget.
    tol = 1e-3 if family == "huginn" else 1e-4
    for o, lp in zip(got, logps):
        for t, v in o[2].items():
            assert abs(v - lp[t].item()) < tol


def test_shared_differs_from_last_exited(checkpoints):
    """The layouts are different semantics (SHARED is lossy at full depth): not a no-op switch."""
    mc, le = make(checkpoints["ouro"], "ouro", "last_exited")
    _, sh = make(checkpoints["ouro"], "ouro", "shared")
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)
    a = run(le(), mc, {"a": (PROMPTS[0], sp)})["a"]
    b = run(sh(), mc, {"a": (PROMPTS[0], sp)})["a"]
    assert a[0][2] != b[0][2]


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_every_block_returns_after_abort_at_any_step(checkpoints, family, layout):
    mc, new_engine = make(checkpoints[family], family, layout)
    reqs = {str(i): (p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, mixed_params(family)))}
    engine, passes = new_engine(), []
    one_pass = engine.step
    engine.step = lambda: passes.append(1) or one_pass()
    full = run(engine, mc, reqs)
    total_steps = 40 if layout == "last_exited" else 60
    # (an abort at a step the run never reaches never happens: that run is the full one; the first
    # such
    # step is kept, the rest are the same run again)
    for step in range(0, min(total_steps, len(passes) + 3), 3):
        engine = new_engine()
        got = run(engine, mc, reqs, abort_at=("0", step))
        assert engine.num_free_blocks == engine.pool.num_blocks
        assert not engine.has_work()
        for rid in ("1", "2"):
            assert [o[:2] for o in got[rid]] == [o[:2] for o in full[rid]]
        assert [o[:2] for o in got["0"]] == [o[:2] for o in full["0"]][: len(got["0"])]
        assert engine.abort("0") is False  # idempotent


def test_blocks_free_after_finish_and_admission_limits(checkpoints):
    mc, new_engine = make(checkpoints["ouro"], "ouro", num_blocks=40, max_num_seqs=2)
    engine = new_engine()
    sp = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    p = resolve_params(mc, 6, sp)
    # a request holds the blocks of the positions it has reached (4-position blocks, 4 planes): the
    # prompt and its first decode position at admission, one more block per plane at position 8
    for i in range(4):
        engine.add_request(str(i), [1, 2, 3, 4, 5, 6], p)
    running_max, finished, held = 0, [], set()
    while engine.has_work():
        for o in engine.step():
            if o.finish_reason:
                finished.append(o.request_id)
        running_max = max(running_max, len(engine.running))
        for s in engine.running:
            reached = max([s.admit_positions] + [g.start + g.n for g in s.in_flight])
            assert len(s.tables.core[0]) == -(-reached // 4)
            held.add(len(s.tables.core[0]))
        # (a block of the shared prompt prefix, cached by an earlier request, is counted once)
        assert engine.num_free_blocks == 40 - len(
            {b for s in engine.running for t in s.tables.core for b in t}
        )
    assert held == {2, 3} and engine.preemptions == 0
    assert running_max == 2 and finished == ["0", "1", "2", "3"]  # max_num_seqs, FCFS
    assert engine.num_free_blocks == 40
    with pytest.raises(
        RequestError, match="can never fit: prompt 6 \\+ max_tokens 40 needs 48 KV blocks"
    ):
        engine.add_request(
            "big", [1, 2, 3, 4, 5, 6], resolve_params(mc, 6, SamplingParams(max_tokens=40))
        )
    engine.add_request("x", [1, 2], p)
    with pytest.raises(RequestError, match="already live"):
        engine.add_request("x", [1, 2], p)


def test_priority_orders_admission(checkpoints):
    mc, new_engine = make(checkpoints["nanbeige"], "nanbeige", max_num_seqs=1)
    engine = new_engine()
    p = resolve_params(mc, 3, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    engine.add_request("late", [1, 2, 3], p, priority=5)
    engine.add_request("urgent", [1, 2, 3], p, priority=-1)
    engine.add_request("normal", [1, 2, 3], p)
    order = []
    while engine.has_work():
        order += [o.request_id for o in engine.step() if o.finish_reason]
    assert order == ["urgent", "normal", "late"]


def test_stop_conditions(checkpoints):
    """A stop token ends the request there although its next token's first loop was already
    launched (tokens are read back one step late); that work is dropped, every block comes back,
    and a neighbour's tokens do not change."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    b = (PROMPTS[0], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    free = run(
        new_engine(),
        mc,
        {"a": (PROMPTS[1], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)), "b": b},
    )
    toks = [o[0] for o in free["a"]]
    engine = new_engine()
    blocks = engine.num_free_blocks
    got = run(
        engine,
        mc,
        {
            "a": (
                PROMPTS[1],
                SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[toks[2]]),
            ),
            "b": b,
        },
    )
    stop_at = toks.index(toks[2])
    assert [o[0] for o in got["a"]] == toks[: stop_at + 1] and got["a"][-1][3] == "stop"
    assert got["b"] == free["b"] and engine.num_free_blocks == blocks
    assert free["a"][-1][3] == "length" and all(o[3] is None for o in free["a"][:-1])


@pytest.mark.parametrize("family", ["nanbeige", "huginn"])
def test_threshold_means_nothing_without_a_gate(checkpoints, family):
    mc, new_engine = make(checkpoints[family], family)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, exit_threshold=0.0)
    got = run(new_engine(), mc, {"a": (PROMPTS[0], sp)})["a"]
    assert [o[1] for o in got] == [mc.depth] * 6


def test_default_pool_fills_the_memory_budget(checkpoints):
    """A physical block holds max(core, boundary) layers, so the budget buys that many blocks."""
    mc = ModelConfig.from_pretrained(checkpoints["huginn"])
    model = load_model(mc, torch.float32)
    eng = LoopEngine(mc, model, EngineConfig(kv_memory_bytes=1 << 22, block_size=16), torch.float32)
    block = 2 * max(4, 2 + 2) * mc.kv.num_kv_heads * mc.kv.head_dim * 4 * 16
    assert eng.pool.num_blocks == (1 << 22) // block
    # + the scratch block, never lent
    assert eng.pool.cache.numel() * 4 == (eng.pool.num_blocks + 1) * block


def test_step_buffers_pack_and_append():
    """A step's fields come back with their shapes and values (floats through their bit patterns);
    an appended pack lands after the first, whose views stay intact; a pack larger than the buffer
    grows it."""
    import numpy as np

    from rlt.workers.step_buffers import StepBuffers

    b = StepBuffers("cpu", capacity=16)
    t = b.pack({"a": np.arange(6).reshape(2, 3), "f": np.array([0.5, -2.25], dtype=np.float32)})
    u = b.pack({"c": np.array([7, 8, 9])}, append=True)
    assert t["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and t["f"].dtype == torch.float32
    assert t["f"].tolist() == [0.5, -2.25] and u["c"].tolist() == [7, 8, 9]
    # every field starts 16-byte aligned (one Triton variant whatever the packing)
    odd = b.pack({"p": np.arange(3), "q": np.arange(5)})
    odd |= b.pack({"r": np.arange(1)}, append=True)
    assert all(v.data_ptr() % 16 == 0 for v in (*t.values(), *u.values(), *odd.values()))
    big = b.pack({"x": np.arange(40)})
    assert big["x"].tolist() == list(range(40)) and b.host.numel() >= 40
    w = b.pack({"y": np.arange(30)}, append=True)  # does not fit after x: fresh buffers, x intact
    assert w["y"].tolist() == list(range(30)) and big["x"].tolist() == list(range(40))


def test_pass_rows_of_one_group_as_of_many():
    """A lone group's positions and slots (the fast path a lone prompt takes) are the rows the
    general layout gives that group inside a pass of several."""
    from rlt.workers.pass_rows import padded, positions, row_slots, row_starts

    class G:
        def __init__(self, start, n):
            self.start, self.n = start, n

    groups, tables = [G(5, 1), G(70, 9), G(0, 3)], [[4], [9, 2, 7], [3]]
    rs = row_starts(groups)
    assert rs == [0, 1, 10, 13]
    pos = positions(groups, rs)
    slots = row_slots(padded(tables), rs, pos, 32)
    for i, g in enumerate(groups):
        alone = positions([g], row_starts([g]))
        assert (
            alone.tolist() == pos[rs[i] : rs[i + 1]].tolist() == list(range(g.start, g.start + g.n))
        )
        one = row_slots(padded([tables[i]]), row_starts([g]), alone, 32)
        assert one.tolist() == slots[rs[i] : rs[i + 1]].tolist()
    # positions 70..78: the table's third block (7)
    assert slots[1:10].tolist() == [7 * 32 + 6 + k for k in range(9)]


@pytest.mark.parametrize(
    "family,layout,fixed",
    [
        ("ouro", "last_exited", False),
        ("ouro", "shared", False),
        ("ouro", "last_exited", True),
        ("nanbeige", "last_exited", True),
    ],
)
def test_steady_decode_equals_the_regular_path(checkpoints, family, layout, fixed):
    """Decode stretches run as device-side lanes give the same tokens, exit depths and logprobs as
    the regular path: mixed sampling and exit parameters (or fixed depth, where passes no lane can
    exit in skip the head), arrivals that end and restart steady decode, a stop token, an abort;
    every block comes back."""
    import msgspec

    mc, new_engine = make(checkpoints[family], family, layout)
    params = [
        msgspec.structs.replace(p, exit_threshold=None, min_loops=None) if fixed else p
        for p in mixed_params(family)
    ]
    toks = [
        o[0]
        for o in run(new_engine(steady_decode="never"), mc, {"s": (PROMPTS[1], params[0])})["s"]
    ]
    stop = SamplingParams(
        max_tokens=12,
        temperature=0,
        ignore_eos=True,
        stop_token_ids=[toks[4]],
        logprobs=1,
        exit_threshold=0.5 if family == "ouro" else None,
    )
    requests = {str(i): (PROMPTS[i % 3], params[i % 3]) for i in range(5)} | {
        "s": (PROMPTS[1], stop)
    }
    arrivals = {"0": 0, "1": 0, "s": 0, "2": 9, "3": 30, "4": 31}
    runs = {}
    for steady in (False, True):
        engine = new_engine(
            steady_decode=("always" if fixed else "adaptive") if steady else "never"
        )
        blocks = engine.num_free_blocks
        runs[steady] = run(engine, mc, requests, arrivals, abort_at=("1", 12))
        assert engine.num_free_blocks == blocks and not engine.has_work()
        assert (engine.steady_steps > 10) == steady  # steady decode ran, and only when on
    # tokens, depths and finish reasons exactly; logprobs to float32 rounding (steady decode runs
    # the head over every lane, so its GEMM has another row count)
    for rid, outs in runs[False].items():
        assert [(o[0], o[1], o[3]) for o in runs[True][rid]] == [(o[0], o[1], o[3]) for o in outs]
        for (_, _, a, _), (_, _, b, _) in zip(runs[True][rid], outs):
            assert (a or {}).keys() == (b or {}).keys() and all(
                abs(a[t] - b[t]) < 1e-5 for t in a or ()
            )
    assert [o[0] for o in runs[True]["s"]][-1] == toks[4] and runs[True]["s"][-1][3] == "stop"
    assert 0 < len(runs[True]["1"]) < 7  # aborted mid-decode


def test_steady_decode_runs_only_when_a_request_can_exit_early(checkpoints):
    """By default steady decode serves stretches where some running request has adaptive exit; at
    fixed depth everywhere the regular path runs (faster there), unless steady_decode="always"."""
    mc, new_engine = make(checkpoints["ouro"], "ouro")
    fixed = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    adaptive = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, exit_threshold=0.5)
    for cfg, params, runs_steady in (
        (dict(), (fixed, fixed), False),
        (dict(), (fixed, adaptive), True),
        (dict(steady_decode="always"), (fixed, fixed), True),
    ):
        engine = new_engine(**cfg)
        run(engine, mc, {str(i): (PROMPTS[i], p) for i, p in enumerate(params)})
        assert (engine.steady_steps > 0) == runs_steady, (cfg, params)


def test_decode_roofline_arithmetic(checkpoints):
    """The offline benchmark's decode roofline: core weights once per loop, every row's KV at every
    loop, the head."""
    from rlt.bench import floors

    mc = ModelConfig.from_pretrained(checkpoints["ouro"])
    model = load_model(mc, torch.float32)
    fc = mc.family_config
    H, I, L = fc.hidden_size, fc.intermediate_size, fc.num_hidden_layers
    q, kv = fc.num_attention_heads * fc.head_dim, fc.num_key_value_heads * fc.head_dim
    weights = L * (H * (q + 2 * kv) + q * H + 2 * I * H + I * H) * 4  # float32 checkpoint
    kv_row_loop = 100 * L * 2 * kv * 4  # 100 positions, K and V
    head = mc.vocab_size * H * 4
    got = floors.decode_roofline(model, mc, concurrency=3, context=100, read_gbps=1.0)
    assert got["bytes_per_step"] == mc.depth * (weights + 3 * kv_row_loop) + head
    assert got["weight_bytes"] == mc.depth * weights + head
    assert got["kv_bytes"] == mc.depth * 3 * kv_row_loop
    assert got["ms_per_step"] == round(got["bytes_per_step"] / 1e6, 3)


def test_profile_splits_busy_time_among_overlapping_kernels():
    """The GPU profile: kernels overlapping under PDL each get only the busy time past the kernels
    started before them (idle gaps go to no one), labelled by name, grid and previous kernel."""
    from rlt.bench import profile

    def k(name, ts, dur, grid):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": grid}}

    trace = {
        "traceEvents": [
            k("_gemv_kernel", 0.0, 10.0, [1024, 1, 1]),
            # not a kernel
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.0, "dur": 2.0},
            k("_rope_kernel", 8.0, 4.0, [1, 48, 1]),  # starts under the GEMV: adds 2
            k("_decode_kernel", 9.0, 2.0, [1, 16, 32]),  # inside both: adds nothing
            k("_gemv_kernel", 20.0, 5.0, [1024, 1, 1]),  # after an 8 µs idle gap: adds its 5
        ]
    }
    kernels = profile.labelled_kernels(trace)
    assert [label for label, _, _ in kernels] == [
        "_gemv_kernel [1024x1x1] after -",
        "_rope_kernel [1x48x1] after _gemv_kernel",
        "_decode_kernel [1x16x32] after _rope_kernel",
        "_gemv_kernel [1024x1x1] after _decode_kernel",
    ]
    assert profile.attribute_busy(kernels) == {
        "_gemv_kernel [1024x1x1] after -": 10.0,
        "_rope_kernel [1x48x1] after _gemv_kernel": 2.0,
        "_decode_kernel [1x16x32] after _rope_kernel": 0.0,
        "_gemv_kernel [1024x1x1] after _decode_kernel": 5.0,
    }
    assert profile.busy_us([(a, b) for _, a, b in kernels]) == 17.0
    assert (
        profile.short_name(
            "void at::native::(anonymous namespace)::indexSelect<c10::BFloat16, long>(int)"
        )
        == "at::native::anon::indexSelect"
    )
    assert (
        profile.short_name("std::enable_if<!(false), void>::type internal::gemvx::kernel<int>(int)")
        == "internal::gemvx::kernel"
    )


@pytest.mark.parametrize(
    "rows,prefix,heads", [(1, 5, (4, 2)), (7, 3, (4, 4)), (64, 100, (4, 1)), (256, 1000, (4, 2))]
)
def test_reference_attention_matches_plain_softmax(rows, prefix, heads):
    """The reference attention the CPU runs (a prefix chunk: two flash halves merged by log-sum-exp)
    equals softmax(QK^T)V written out in float64, for grouped and plain heads."""
    from rlt.kernels.attention import causal_attention

    H, Hkv = heads
    g = torch.Generator().manual_seed(rows)
    q = torch.randn(rows, H, 16, generator=g)
    k, v = torch.randn(2, prefix + rows, Hkv, 16, generator=g)
    kk, vv = (x.double().repeat_interleave(H // Hkv, dim=1) for x in (k, v))
    s = torch.einsum("thd,shd->hts", q.double(), kk) * 16**-0.5
    visible = torch.arange(prefix + rows)[None] <= (prefix + torch.arange(rows))[:, None]
    want = torch.einsum("hts,shd->thd", s.masked_fill(~visible, float("-inf")).softmax(-1), vv)
    assert torch.allclose(causal_attention(q, k, v, prefix).double(), want, atol=2e-6, rtol=0)


def test_cpu_prefill_of_8192_tokens_is_one_pass(checkpoints):
    """The default tiny model prefills 8,192 tokens with default options in one pass per loop (its
    speed is a benchmark: docs/performance.md, CPU)."""
    from rlt.models.default_model import default_model_path

    mc = ModelConfig.from_pretrained(default_model_path())
    eng = LoopEngine(mc, load_model(mc, torch.float32), EngineConfig(), torch.float32)
    prompt = [(i * 7) % 400 + 3 for i in range(8192)]
    eng.add_request(0, prompt, resolve_params(mc, len(prompt), SamplingParams(max_tokens=1)))
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
    # a pass per loop over all 8,192 rows, then the step that reads the token
    assert steps == mc.depth + 1


def test_a_grammar_that_does_not_compile_fails_the_start(checkpoints):
    """The memory profile and the warm-up run requests with a grammar to their end: one whose
    compile fails (here a regex no check caught before the worker) raises, naming it, where the
    worker would otherwise wait for it forever and never say READY."""
    from rlt.contract.sampling_params import StructuredOutput
    from rlt.workers.memory import finish

    mc, new_engine = make(checkpoints["ouro"], "ouro")
    engine = new_engine()
    sp = SamplingParams(max_tokens=2, structured_output=StructuredOutput(regex="([a-z"))
    engine.add_request(0, [3, 4], resolve_params(mc, 2, sp))
    with pytest.raises(
        RuntimeError, match=r"did not compile before READY: structured_output\.regex: .+"
    ):
        finish(engine)
