"""GPU checks of the engine (run on the GPU machine: `pytest -m gpu`): the same engine in bf16 on
CUDA against float32 on the CPU, CUDA graphs and steady decode equal to eager and regular passes,
nothing compiled or captured after READY, and PD across two GPUs against single."""

import asyncio
import gc

import pytest
import torch

import rlt
from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.models.loader import load_model
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine

pytestmark = pytest.mark.gpu


PROMPTS = [[5 + (i * 7 + j) % 400 for j in range(n)] for i, n in enumerate((9, 30, 17, 44, 3))]


def decode_all(mc, model, cfg, prompts, sp, dtype=torch.bfloat16, device="cuda"):
    """Every prompt through one engine at once -> ({id: [(token, depth, logprobs)]}, the engine)."""
    eng = LoopEngine(mc, model, cfg, dtype, device)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
    out = {str(i): [] for i in range(len(prompts))}
    while eng.has_work():
        for o in eng.step():
            out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs))
    return out, eng


def first_logprobs(path, device, dtype, prompt):
    mc = ModelConfig.from_pretrained(
        path, hf_overrides={"mean_recurrence": 8} if "huginn" in path else None
    )
    eng = LoopEngine(mc, load_model(mc, dtype, device), EngineConfig(num_blocks=256), dtype, device)
    eng.add_request(
        "a",
        prompt,
        resolve_params(mc, len(prompt), SamplingParams(max_tokens=1, temperature=0, logprobs=5)),
    )
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_pd_on_two_gpus_equals_single(checkpoints):
    prompts = [[5 + i for i in range(n)] for n in (9, 40, 100)]
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, exit_threshold=0.5)

    async def serve(topology):
        async with rlt.Engine.launch(
            checkpoints["ouro"],
            topology=topology,
            device="cuda",
            dtype="bfloat16",
            prefill_chunk=16,
            num_blocks=512,
        ) as engine:
            outs = []
            for i, p in enumerate(prompts):  # one at a time: identical batch shapes on both sides
                async for out in engine.generate(p, sp, request_id=str(i)):
                    pass
                outs.append((out.token_ids, out.exit_depths))
            pids = [w.pid for w in engine.stats().workers]
            return outs, pids

    single, _ = asyncio.run(serve("single"))
    pd, pids = asyncio.run(serve("1p1d"))
    assert len(pids) == 2
    assert single == pd


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_engine_batch_invariant_bf16(checkpoints, family):
    """With batch_invariant on, a request's tokens and depths are the same alone and in a batch."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    model = load_model(mc, torch.bfloat16, "cuda")
    cfg = EngineConfig(num_blocks=512, prefill_chunk=8, batch_invariant=True)
    prompts = [[5 + (i * 7 + j) % 400 for j in range(n)] for i, n in enumerate((9, 30, 17, 44))]
    sps = [
        SamplingParams(
            max_tokens=12,
            temperature=0,
            ignore_eos=True,
            exit_threshold=0.5 if family == "ouro" else None,
        ),
        SamplingParams(max_tokens=10, temperature=0.9, seed=4, ignore_eos=True),
    ] * 2

    def run(items):
        eng = LoopEngine(mc, model, cfg, torch.bfloat16, "cuda")
        for rid, (p, sp) in items:
            eng.add_request(rid, p, resolve_params(mc, len(p), sp))
        out = {rid: [] for rid, _ in items}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth))
        return out

    items = [(str(i), (p, sp)) for i, (p, sp) in enumerate(zip(prompts, sps))]
    together = run(items)
    for item in items:
        assert run([item])[item[0]] == together[item[0]]


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_cuda_graphs_equal_eager(checkpoints, family):
    """Passes replayed from CUDA graphs — decode passes and passes carrying prompt chunks (padded
    rows, tiles and tables; rows at different depths) — give the same tokens and depths as eager
    passes; with batch-invariant kernels, the same logprobs too."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    model = load_model(mc, torch.bfloat16, "cuda")
    sp = SamplingParams(
        max_tokens=14,
        temperature=0,
        ignore_eos=True,
        logprobs=3,
        exit_threshold=0.5 if family == "ouro" else None,
    )

    def run(graph_max):
        return decode_all(
            mc,
            model,
            EngineConfig(
                num_blocks=512,
                prefill_chunk=8,
                batch_invariant=True,
                cuda_graph_max_batch=graph_max,
            ),
            PROMPTS,
            sp,
        )

    eager, _ = run(0)
    graphed, eng = run(256)
    # both kinds captured and used
    assert eng.backend.decode_graphs.graphs and eng.backend.pass_graphs.graphs
    assert graphed == eager


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_lone_prompt_graphs_equal_eager(checkpoints, family):
    """A lone prompt's first chunk replays a prompt graph (dense SDPA over rows padded to its bucket)
    at every loop: float32 on CUDA, the same first tokens, depths and logprobs (to 1e-4) as eager
    passes, for lengths at, under and between buckets."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    model = load_model(mc, torch.float32, "cuda")
    sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=3)
    prompts = [[3 + (7 * j + n) % 400 for j in range(n)] for n in (64, 100, 128, 300, 1000)]

    def run(graph_max):
        cfg = EngineConfig(num_blocks=2048, prefill_chunk=1024, cuda_graph_max_batch=graph_max)
        outs = [decode_all(mc, model, cfg, [p], sp, dtype=torch.float32) for p in prompts]
        return [o["0"] for o, _ in outs], outs[-1][1]

    eager, _ = run(0)
    graphed, eng = run(256)
    # the 1,000-token prompt replayed its bucket's graph
    assert list(eng.backend.prompt_graphs.graphs) == [1024]
    for a, b in zip(graphed, eager):
        assert [(t, d) for t, d, _ in a] == [(t, d) for t, d, _ in b]
        for (_, _, la), (_, _, lb) in zip(a, b):
            assert la.keys() == lb.keys() and all(abs(la[k] - lb[k]) < 1e-4 for k in la)


def test_a_graph_collected_during_a_capture_leaves_it_intact(checkpoints):
    """A CUDA graph the garbage collector frees while another is being captured (an engine left in a
    reference cycle, collected during the next one's captures) must not break that capture: CUDA
    forbids destroying a graph then. Fault: inside each capture, a captured graph is dropped into a
    cycle and the collector is given every chance to run (threshold 1)."""
    mc = ModelConfig.from_pretrained(checkpoints["ouro"])
    model = load_model(mc, torch.bfloat16, "cuda")
    cfg = EngineConfig(num_blocks=512, prefill_chunk=8, cuda_graph_max_batch=16)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    plain, _ = decode_all(mc, model, cfg, PROMPTS, sp)
    spare, x = [], torch.zeros(1, device="cuda")
    for _ in range(3):
        spare.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(spare[-1]):
            x += 1
    loop = model.loop

    def loop_dropping_a_graph(*args):
        if spare and torch.cuda.is_current_stream_capturing():
            cycle = [spare.pop()]
            cycle.append(cycle)
            del cycle
            _ = [[] for _ in range(1000)]  # allocations: the collector's turn
        return loop(*args)

    model.loop = loop_dropping_a_graph
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        graphed, eng = decode_all(mc, model, cfg, PROMPTS, sp)
    finally:
        gc.set_threshold(*threshold)
        del model.loop
    assert not spare and eng.backend.decode_graphs.graphs and eng.backend.pass_graphs.graphs
    assert graphed == plain


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_cuda_decode_equals_cpu_in_float32(checkpoints, family):
    """Greedy decode on CUDA in float32 (kernels, CUDA graphs, tokens fed to the next pass on the
    device and read back one step late through pinned memory) gives the CPU reference's tokens and
    exit depths."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    sp = SamplingParams(
        max_tokens=10,
        temperature=0,
        ignore_eos=True,
        exit_threshold=0.5 if family == "ouro" else None,
    )
    prompts = [[5 + (i * 11 + j) % 400 for j in range(n)] for i, n in enumerate((12, 33, 7))]

    def run(device):
        out, _ = decode_all(
            mc,
            load_model(mc, torch.float32, device),
            EngineConfig(num_blocks=256, prefill_chunk=16),
            prompts,
            sp,
            torch.float32,
            device,
        )
        return {rid: [o[:2] for o in outs] for rid, outs in out.items()}

    assert run("cuda") == run("cpu")


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_one_row_decode_equals_cpu_in_float32(checkpoints, family):
    """One request alone decodes through the one-row GEMVs and their SwiGLU and add + RMSNorm
    epilogues (Ouro's exit gate too) in float32 to the CPU reference's tokens and exit depths."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    sp = SamplingParams(
        max_tokens=12,
        temperature=0,
        ignore_eos=True,
        exit_threshold=0.5 if family == "ouro" else None,
    )

    def run(device, prompts):
        out, _ = decode_all(
            mc,
            load_model(mc, torch.float32, device),
            EngineConfig(num_blocks=256, prefill_chunk=16),
            prompts,
            sp,
            torch.float32,
            device,
        )
        return {rid: [o[:2] for o in outs] for rid, outs in out.items()}

    alone = [[7 + j % 300 for j in range(21)]]
    # GEMMs of 3 rows
    batch = [[5 + (i * 11 + j) % 400 for j in range(n)] for i, n in enumerate((12, 33, 7))]
    assert run("cuda", alone) == run("cpu", alone)
    assert run("cuda", batch) == run("cpu", batch)


@pytest.mark.parametrize("family,threshold", [("ouro", 0.5), ("ouro", None), ("nanbeige", None)])
def test_steady_one_row_equals_regular(checkpoints, family, threshold):
    """One request alone in steady decode — the one-row GEMVs with their epilogues and the exit gate,
    split decode attention, PDL, the core graph (at fixed depth the passes without the head too):
    the regular path's tokens and exit depths."""
    mc = ModelConfig.from_pretrained(checkpoints[family])
    model = load_model(mc, torch.bfloat16, "cuda")
    sp = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, exit_threshold=threshold)

    def run(steady):
        cfg = EngineConfig(
            num_blocks=512,
            prefill_chunk=8,
            cuda_graph_max_batch=256,
            steady_decode="always" if steady else "never",
        )
        out, eng = decode_all(mc, model, cfg, PROMPTS[3:4], sp)
        return [o[:2] for o in out["0"]], eng.steady_steps

    (regular, _), (steady, steps) = run(False), run(True)
    assert steps > 10 and len(regular) == 16
    assert steady == regular


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
@pytest.mark.parametrize("graphs", [0, 256])
def test_steady_decode_equals_regular_on_cuda(checkpoints, family, graphs):
    """Steady decode on the GPU (device-side lanes, with and without CUDA graphs) against the regular
    path, with batch-invariant kernels: the same tokens and depths, logprobs to float32 rounding
    (log_softmax runs over every lane there). Huginn: exits by latent-diff, checked on the device,
    parked lanes leaving in boundary passes."""
    mc = ModelConfig.from_pretrained(
        checkpoints[family], hf_overrides={"mean_recurrence": 8} if family == "huginn" else None
    )
    model = load_model(mc, torch.bfloat16, "cuda")
    exits = {
        "ouro": dict(exit_threshold=0.5),
        "huginn": dict(exit_criterion="latent-diff", exit_threshold=0.4),
    }
    sp = SamplingParams(
        max_tokens=14, temperature=0, ignore_eos=True, logprobs=3, **exits.get(family, {})
    )

    def run(steady):
        out, eng = decode_all(
            mc,
            model,
            EngineConfig(
                num_blocks=512,
                prefill_chunk=8,
                batch_invariant=True,
                cuda_graph_max_batch=graphs,
                steady_decode="always" if steady else "never",
            ),
            PROMPTS,
            sp,
        )
        return out, eng.steady_steps

    (regular, _), (steady, steps) = run(False), run(True)
    assert steps > 10
    for rid, outs in regular.items():
        assert [o[:2] for o in steady[rid]] == [o[:2] for o in outs]
        for (_, _, a), (_, _, b) in zip(steady[rid], outs):
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)


def test_preempted_requests_resume_exactly_on_the_gpu(checkpoints):
    """Batch-invariant kernels: a pool too small for every request at once preempts and resumes by
    recompute, and every stream's tokens and exit depths equal the unpreempted run's."""
    mc = ModelConfig.from_pretrained(checkpoints["ouro"])
    model = load_model(mc, torch.bfloat16, "cuda")
    prompts = [
        [5 + (i * 11 + j) % 300 for j in range(n)] for i, n in enumerate((9, 40, 17, 60, 3, 33))
    ]
    sp = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, exit_threshold=0.5)
    runs = {}
    for blocks in (4096, 4 * 13):  # 4 planes; the largest request alone needs 4 x 7 blocks
        cfg = EngineConfig(num_blocks=blocks, prefill_chunk=8, batch_invariant=True)
        out, eng = decode_all(mc, model, cfg, prompts, sp)
        runs[blocks] = ({r: [o[:2] for o in v] for r, v in out.items()}, eng.preemptions)
        assert eng.num_free_blocks == blocks
    assert runs[4096][1] == 0 and runs[52][1] >= 2
    assert runs[52][0] == runs[4096][0]


def test_prefix_cache_hits_equal_the_cache_off_run_on_the_gpu(checkpoints):
    """Batch-invariant kernels: second turns (each first prompt + its output + new tokens) admitted
    onto cached blocks stream the cache-off run's tokens and exit depths (Ouro, adaptive exit)."""
    mc = ModelConfig.from_pretrained(checkpoints["ouro"])
    model = load_model(mc, torch.bfloat16, "cuda")
    sp = resolve_params(
        mc, 1, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, exit_threshold=0.5)
    )
    firsts = [[5 + (i * 11 + j) % 300 for j in range(n)] for i, n in enumerate((40, 70, 33))]

    def drive(eng, prompts):
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, sp)
        out = {str(i): [] for i in range(len(prompts))}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth))
        return out

    runs = {}
    for caching in (True, False):
        cfg = EngineConfig(
            num_blocks=4096, prefill_chunk=16, batch_invariant=True, enable_prefix_caching=caching
        )
        eng = LoopEngine(mc, model, cfg, torch.bfloat16, "cuda")
        one = drive(eng, firsts)
        two = drive(
            eng, [p + [t for t, _ in one[str(i)]] + [7, 8, 9] for i, p in enumerate(firsts)]
        )
        runs[caching] = (one, two, eng.pool.prefix.hit_tokens if caching else 0)
        assert eng.num_free_blocks == 4096
    assert runs[True][:2] == runs[False][:2]
    assert runs[True][2] >= 32 + 64 + 32  # at least every first prompt's full blocks


def test_nothing_compiles_or_captures_after_ready(checkpoints):
    """Default options: the pool is sized from the device's memory and the worker warms up before
    READY; a mixed run (prompt lengths from 1 to 3,000, decode batches up to 64, greedy, sampled
    with logprobs, adaptive exit, logit edits, penalties, prompt logprobs and self-speculation) then builds no CUDA
    graph and no Triton specialization."""
    from rlt.workers.memory import EDITS

    kinds = [
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
        SamplingParams(
            max_tokens=24,
            temperature=0.8,
            top_k=40,
            top_p=0.95,
            seed=1,
            ignore_eos=True,
            logprobs=3,
        ),
        SamplingParams(
            max_tokens=24, temperature=0, ignore_eos=True, exit_threshold=0.6, min_loops=2
        ),
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, max_loops=3),
        SamplingParams(
            max_tokens=24, temperature=0.9, seed=2, exit_threshold=0.6, logprobs=2, **EDITS
        ),
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, prompt_logprobs=5, **EDITS),
        SamplingParams(
            max_tokens=24, temperature=0.7, seed=3, ignore_eos=True, speculative_loops=1
        ),
    ]
    lengths = [1, 5, 16, 17, 31, 64, 100, 255, 300, 700, 1500, 3000]

    async def serve():
        async with rlt.Engine.launch(
            checkpoints["ouro"], device="cuda", startup_timeout=600
        ) as engine:
            w = engine.stats().workers[0]
            assert w.kv_blocks_total >= 4096  # from free memory, not a fixed 1 GiB

            async def one(i, n):
                async for _ in engine.generate(
                    [3 + (i * 7 + j) % 500 for j in range(n)], kinds[i % len(kinds)]
                ):
                    pass

            for wave in (1, 8, 64, 3):
                await asyncio.gather(
                    *(one(i, lengths[(i * 5) % len(lengths)]) for i in range(wave))
                )
            return engine.stats().workers[0]

    w = asyncio.run(serve())
    assert (w.captures_after_ready, w.compiles_after_ready) == (0, 0), w


def test_huginn_lanes_build_nothing_after_ready(checkpoints):
    """Huginn's steady decode after the default warm-up: lanes exiting by latent criteria and at
    fixed depth, greedy and sampled, waves of 1 to 64 lanes with their boundary passes, build no
    CUDA graph and no Triton specialization."""
    kinds = [
        SamplingParams(
            max_tokens=12,
            temperature=0,
            ignore_eos=True,
            exit_criterion="latent-diff",
            exit_threshold=0.4,
        ),
        SamplingParams(
            max_tokens=12,
            temperature=0.8,
            seed=3,
            top_k=20,
            logprobs=2,
            ignore_eos=True,
            exit_criterion="cosine",
            exit_threshold=0.09,
            min_loops=2,
        ),
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, min_loops=3, max_loops=3),
    ]

    async def serve():
        async with rlt.Engine.launch(
            checkpoints["huginn"], device="cuda", startup_timeout=600
        ) as engine:

            async def one(i):
                async for _ in engine.generate(
                    [3 + (i * 7 + j) % 200 for j in range(5 + i % 9)], kinds[i % 3]
                ):
                    pass

            for wave in (1, 3, 16, 64, 2):
                await asyncio.gather(*(one(i) for i in range(wave)))
            return engine.stats().workers[0]

    w = asyncio.run(serve())
    assert (w.captures_after_ready, w.compiles_after_ready) == (0, 0), w


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
def test_exit_criteria_on_cuda_equal_cpu_and_the_authors_code(checkpoints, layout):
    """Every exit criterion's reference case at once in float32 on CUDA, eager and replayed from
    CUDA graphs (rows that exited held on the device while the host reads the verdicts one pass
    late, their K/V sent to the scratch block inside the graphs' inputs), gives the CPU's tokens
    and depths, and under LAST_EXITED the authors' (tests/workers/huginn_reference.json)."""
    from tests.workers.helpers import run
    from tests.workers.huginn_cases import CASES, FIXTURE, expect, params

    mc = ModelConfig.from_pretrained(checkpoints["huginn"], hf_overrides=FIXTURE["overrides"])
    requests = {i: (c["prompt"], params(c)) for i, c in enumerate(CASES)}

    def tokens_depths(device, graph_max=0, wait=0):
        cfg = EngineConfig(
            num_blocks=512,
            prefill_chunk=16,
            kv_layout=layout,
            cuda_graph_max_batch=graph_max,
            exit_wait_passes=wait,
        )
        eng = LoopEngine(mc, load_model(mc, torch.float32, device), cfg, torch.float32, device)
        out = run(eng, mc, requests)
        if graph_max:
            assert eng.backend.decode_graphs.graphs and eng.backend.pass_graphs.graphs
        return {i: [o[:2] for o in outs] for i, outs in out.items()}

    cpu = tokens_depths("cpu")
    assert tokens_depths("cuda") == cpu
    assert tokens_depths("cuda", 256) == cpu
    # exited rows parked, K/V to scratch in the graphs' inputs
    assert tokens_depths("cuda", 256, wait=3) == cpu
    if layout == "last_exited":
        expect({i: [(*o, None, None) for o in outs] for i, outs in cpu.items()}, CASES)


def test_structured_output_after_warm_up_valid_and_steady_decode_neutral(checkpoints):
    """Structured output on the Triton kernels and CUDA graphs, after the memory profile and
    warm_up: every constrained output obeys its grammar, nothing compiles or captures after the
    warm-up, and steady decode on or off gives the same tokens."""
    from rlt.models.tokenizer import load_tokenizer
    from rlt.workers.counters import count_triton_compiles
    from rlt.workers.warmup import warm_up
    from tests.workers.grammar_cases import check_valid, workload

    path = checkpoints["ouro"]
    mc = ModelConfig.from_pretrained(path)
    model, tok = load_model(mc, torch.bfloat16, "cuda"), load_tokenizer(path)
    reqs, tokens = workload(tok), {}
    for steady in ("never", "always"):
        cfg = EngineConfig(steady_decode=steady, max_num_seqs=16, gpu_memory_utilization=0.3)
        eng = LoopEngine(mc, model, cfg, torch.bfloat16, "cuda")
        count_triton_compiles(eng.counters)
        warm_up(eng, log=lambda s: None)
        before = (eng.counters.captures, eng.counters.compiles)
        for rid, (p, sp) in reqs.items():
            eng.add_request(rid, p, resolve_params(mc, len(p), sp))
        out = {r: [] for r in reqs}
        while eng.has_work():
            for o in eng.step():
                out[o.request_id].append((o.token_id, o.exit_depth, o.logprobs, o.finish_reason))
        check_valid(tok, out)
        assert (eng.counters.captures - before[0], eng.counters.compiles - before[1]) == (0, 0)
        tokens[steady] = {r: [o[0] for o in v] for r, v in out.items()}
    assert tokens["never"] == tokens["always"]


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_speculation_equals_plain_on_cuda(tmp_path, family):
    """Self-speculation in bf16 with CUDA graphs and batch-invariant kernels (a verify pass of k rows
    computes each row as a one-row pass does): tokens, depths and logprobs equal the plain run's,
    greedy and sampled, and most drafts are taken (small loop updates)."""
    from rlt.models.checkpoint import make_checkpoint

    path = make_checkpoint(family, str(tmp_path / family), seed=1, update_scale=0.01)
    mc = ModelConfig.from_pretrained(
        path, hf_overrides={"mean_recurrence": 6} if family == "huginn" else None
    )
    model = load_model(mc, torch.bfloat16, "cuda")
    sps = [
        SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=3),
        SamplingParams(
            max_tokens=33, temperature=0.8, top_k=40, seed=3, ignore_eos=True, logprobs=2
        ),
    ]
    runs = {}
    for loops in (0, 1):
        cfg = EngineConfig(
            num_blocks=512, prefill_chunk=8, batch_invariant=True, speculative_loops=loops
        )
        runs[loops] = [decode_all(mc, model, cfg, PROMPTS, sp) for sp in sps]
    for (plain, _), (spec, eng) in zip(runs[0], runs[1]):
        assert spec == plain
        assert eng.spec_accepted > 0.7 * eng.spec_drafts, (eng.spec_accepted, eng.spec_drafts)
