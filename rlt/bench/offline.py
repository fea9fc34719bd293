"""The offline benchmark: one in-process LoopEngine, every request submitted at once (random
prompts, greedy, EOS ignored; optionally every request penalized, beside the same unpenalized);
decode throughput and mean exit depth, prefill latency, and both against their floors
(rlt/bench/floors.py).
"""

import os
import platform
import time

import msgspec
import torch

from rlt import envs
from rlt.bench import floors
from rlt.contract.config import EngineConfig
from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import resolve_params
from rlt.models.loader import load_model, resolve_dtype
from rlt.models.model_config import ModelConfig
from rlt.workers.engine import LoopEngine


def load(path: str, device: str, dtype: str | None = None):
    """(ModelConfig, torch dtype, model) of a checkpoint directory."""
    mc = ModelConfig.from_pretrained(path)
    dt = resolve_dtype(dtype, device, mc)
    return mc, dt, load_model(mc, dt, device)


def engine_config(max_conc: int, prompt_len: int, kv_gib: float, **options) -> EngineConfig:
    """A pool of kv_gib GiB, room for max_conc sequences and one prompt of each in one chunk;
    options: any other EngineConfig field (kv_layout, cuda_graph_max_batch, steady_decode, kernels)."""
    return EngineConfig(
        **{
            "max_num_seqs": max(max_conc, 1),
            "max_num_batched_tokens": max(2048, min(prompt_len * max_conc, 16384)),
            "prefill_chunk": prompt_len,
            "kv_memory_bytes": int(kv_gib * 2**30),
        }
        | options
    )


class PoolTooSmall(ValueError):
    """The KV pool cannot hold every sequence of a row at once."""


def pool_holds(pool, concurrency: int, positions: int) -> bool:
    """Does the pool hold `concurrency` sequences of `positions` at once?"""
    return concurrency * pool.blocks_needed(positions) <= pool.num_blocks


def check_pool(pool, concurrency: int, positions: int) -> None:
    """The pool must hold every sequence at once, or the run measures a lower concurrency."""
    if not pool_holds(pool, concurrency, positions):
        need = concurrency * pool.blocks_needed(positions)
        raise PoolTooSmall(
            f"the KV pool holds {pool.num_blocks} blocks; concurrency {concurrency} x "
            f"{positions} positions needs {need}"
        )


def submit(
    engine, mc, concurrency: int, prompt_len: int, sp: SamplingParams, low: int = 0, seed: int = 0
) -> None:
    """`concurrency` requests '0', '1', ... of random token ids in [low, vocab)."""
    g = torch.Generator().manual_seed(seed)
    for i in range(concurrency):
        prompt = torch.randint(low, mc.vocab_size, (prompt_len,), generator=g).tolist()
        engine.add_request(str(i), prompt, resolve_params(mc, prompt_len, sp))


# every request penalized (--penalties): what the penalty state and logit edits cost in decode
PENALTIES = dict(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)


def exit_params(threshold, max_tokens: int) -> SamplingParams:
    """Greedy, EOS ignored, at this exit threshold: a float (Ouro's gate), (criterion, threshold)
    (Huginn's exit criteria) or ("depth", k) (every token at depth k)."""
    criterion, threshold = threshold if isinstance(threshold, tuple) else ("gate", threshold)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if criterion == "depth":
        return msgspec.structs.replace(sp, min_loops=threshold, max_loops=threshold)
    return msgspec.structs.replace(sp, exit_criterion=criterion, exit_threshold=threshold)


def decode_run(
    engine,
    mc,
    concurrency: int,
    threshold,
    prompt_len: int,
    max_tokens: int,
    penalized: bool = False,
) -> dict:
    """One row: `concurrency` requests at once, each `max_tokens` tokens at this exit threshold (a
    float: Ouro's gate; (criterion, threshold): Huginn's exit criteria; ("depth", k): every token at
    depth k) (penalized: with PENALTIES)."""
    criterion, threshold = threshold if isinstance(threshold, tuple) else ("gate", threshold)
    sp = exit_params(threshold if criterion == "gate" else (criterion, threshold), max_tokens)
    submit(
        engine,
        mc,
        concurrency,
        prompt_len,
        msgspec.structs.replace(sp, **PENALTIES) if penalized else sp,
    )
    drafts0, accepted0, rounds0, spec_tokens0 = (
        engine.spec_drafts,
        engine.spec_accepted,
        engine.spec_rounds,
        engine.spec_tokens,
    )
    t0 = time.perf_counter()
    seen, tokens, depths, decode_t0, full_t1, full_depths = set(), 0, [], None, None, []
    while engine.has_work():
        outs = engine.step()
        for o in outs:
            tokens += 1
            if o.request_id in seen:
                depths.append(o.exit_depth)  # decode tokens (the first one comes from the prompt)
            seen.add(o.request_id)
        if decode_t0 is None and len(seen) == concurrency:
            decode_t0, decode_tokens0, depths0 = time.perf_counter(), tokens, len(depths)
        if full_t1 is None and decode_t0 is not None and any(o.finish_reason for o in outs):
            full_t1, full_tokens = time.perf_counter(), tokens  # concurrency drops from here on
            full_depths = depths[depths0:]
    # (no per-step synchronize: the engine lets the host run ahead of the GPU between read-backs;
    # outputs only exist once their tokens were read back, so these clocks are honest)
    t1 = time.perf_counter()
    decode_tokens = tokens - decode_tokens0

    def rate(n, dt):
        return round(n / dt, 2) if n and dt > 0 else None

    return {
        "concurrency": concurrency,
        "threshold": threshold if criterion == "gate" else f"{criterion}:{threshold:g}",
        "penalized": penalized,
        "output_tokens": tokens,
        "total_s": round(t1 - t0, 3),
        "tok_per_s": round(tokens / (t1 - t0), 2),
        "decode_tok_per_s": rate(decode_tokens, t1 - decode_t0),
        # decode while every request is still running: the rate at exactly `concurrency`
        "full_conc_tok_per_s": rate(full_tokens - decode_tokens0, full_t1 - decode_t0)
        if full_t1
        else None,
        "mean_decode_depth": round(sum(depths) / len(depths), 2) if depths else None,
        # the tokens of that window: with exits, shallow requests make more of them, so the
        # depth-ratio ideal for the window's rate is 4 / this, not 4 / the run's mean
        "full_conc_mean_depth": round(sum(full_depths) / len(full_depths), 2)
        if full_depths
        else None,
        "full_conc_depth_sd": round(torch.tensor(full_depths, dtype=torch.float).std().item(), 2)
        if len(full_depths) > 1
        else None,
        # self-speculation: draft tokens checked, the share equal to their targets
        "spec_drafts": engine.spec_drafts - drafts0,
        "acceptance": round((engine.spec_accepted - accepted0) / (engine.spec_drafts - drafts0), 3)
        if engine.spec_drafts > drafts0
        else None,
        "tokens_per_round": round(
            (engine.spec_tokens - spec_tokens0) / (engine.spec_rounds - rounds0), 2
        )
        if engine.spec_rounds > rounds0
        else None,
    }


def decode_rows(
    engine,
    mc,
    concurrencies: list[int],
    thresholds: list,
    prompt_len: int,
    max_tokens: int,
    penalized: tuple[bool, ...] = (False,),
) -> list[dict]:
    """A row per (concurrency, threshold, penalized), after a warm-up of every row on the same
    engine (Triton compilation, CUDA-graph capture per batch size and block-table width and
    allocator growth stay out of the timed runs: the first variant of each row runs its full
    length, since tables widen as outputs grow). Each run submits the same prompts: cached by the
    first, so in a measured row every request's first token comes at once (a prefix hit) and the
    decode window runs at the full concurrency; a second, short warm-up meets those hits' passes.
    The pool must hold the largest concurrency at once."""
    for c in concurrencies:  # before any work: every row must run at its full concurrency
        check_pool(engine.pool, c, prompt_len + max_tokens)
    rows = [(c, t, p) for c in concurrencies for t in thresholds for p in penalized]
    for c, t, p in rows:
        decode_run(engine, mc, c, t, prompt_len, max_tokens if p == penalized[0] else 8, p)
        decode_run(engine, mc, c, t, prompt_len, 2, p)  # (the measured run's passes: prefix hits)
    run = (decode_run, engine, mc)
    return [first_uses(engine.counters, *run, c, t, prompt_len, max_tokens, p) for c, t, p in rows]


def first_uses(counters, run, *args) -> dict:
    """run(*args)'s row with the Triton specializations built and CUDA graphs captured while it ran
    (the engine's WorkerCounters; compiles counted once rlt.workers.counters.count_triton_compiles
    is on): a row that pays them is not measuring steady work (the warm-up missed a shape)."""
    c0, k0 = counters.compiles, counters.captures
    row = run(*args)
    return row | {"compiles": counters.compiles - c0, "captures": counters.captures - k0}


def prefill_engine(mc, model, dtype, device: str, n: int, **options) -> LoopEngine:
    """An engine for one n-token prompt at a time, in one chunk (options: other EngineConfig
    fields, e.g. kernels)."""
    cfg = EngineConfig(
        **{
            "max_num_seqs": 1,
            "max_num_batched_tokens": n,
            "prefill_chunk": n,
            "num_blocks": -(-n // 16) * mc.depth + 64,
        }
        | options
    )
    return LoopEngine(mc, model, cfg, dtype, device)


def first_token(engine, mc, prompt: list[int], request_id: str) -> None:
    """A prompt through the engine to its first token."""
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request(request_id, prompt, resolve_params(mc, len(prompt), sp))
    while not engine.step():
        pass


def prefill_ms(mc, model, dtype, device: str, n: int, reps: int = 3, **options) -> float:
    """Median time from submission to the first token of one n-token prompt in one chunk."""
    engine = prefill_engine(mc, model, dtype, device, n, **options)
    g = torch.Generator().manual_seed(n)
    times = []
    for i in range(reps + 1):  # the first is warm-up (compilation)
        # a new one: no prefix cache hit
        prompt = torch.randint(0, mc.vocab_size, (n,), generator=g).tolist()
        t0 = time.perf_counter()
        first_token(engine, mc, prompt, str(i))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times[1:])[reps // 2]


def against_floors(
    rows: list[dict], prefill: list[dict], model, mc, device: str, max_tokens: int
) -> dict:
    """CUDA: measure the ceilings, then add to each decode row its HBM roofline at its concurrency
    and mean context (its prompt and half of max_tokens) and the fraction of it reached at full
    concurrency, and to each prefill row ({"prompt_len", "ms"}) its dense floor. Returns the
    ceilings."""
    torch.cuda.empty_cache()
    ceil = floors.ceilings(device)
    for r in rows:
        context = r["prompt_len"] + max_tokens // 2
        roof = floors.decode_roofline(model, mc, r["concurrency"], context, ceil["read_gbps"])
        r["roofline_tok_per_s"] = roof["tok_per_s"]
        if r["full_conc_tok_per_s"]:
            r["of_roofline"] = round(r["full_conc_tok_per_s"] / roof["tok_per_s"], 3)
    for p in prefill:
        p["floor_ms"] = round(floors.prefill_floor_ms(model, mc, p["prompt_len"]), 2)
        p["x_floor"] = round(p["ms"] / p["floor_ms"], 3)
    return ceil


def environment(device: str) -> dict:
    """Where a benchmark ran: machine, CPUs, torch, GPU, programmatic dependent launch (CUDA)."""
    return {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "pdl": envs.pdl_enabled() if device.startswith("cuda") else None,
    }
