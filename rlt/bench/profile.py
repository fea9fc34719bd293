"""Where a decode step's time goes: GPU busy and idle time from a torch.profiler trace, with the
busy time split among kernels that overlap (programmatic dependent launch starts each before the
previous one ends, so their durations overstate their cost) and summed by part
(rlt/bench/step_parts.py), and host time under cProfile.
`rlt bench profile` (the parser: rlt/bench/cli.py) runs them over an engine's decode steps.
"""

import cProfile
import json
import pstats
import re
import tempfile
import time

import torch

from rlt.bench.step_parts import by_part, decode_bytes, decode_table, prefill_table


def attribute_busy(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """(label, start, end) intervals -> {label: busy time it adds}: in start order, each kernel
    gets the part of its interval past the latest end of the kernels before it (their union is
    the busy time; idle gaps go to no one)."""
    out, end = {}, float("-inf")
    for label, a, b in sorted(kernels, key=lambda k: k[1]):
        out[label] = out.get(label, 0.0) + max(0.0, b - max(a, end))
        end = max(end, b)
    return out


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    return sum(attribute_busy([("", a, b) for a, b in intervals]).values())


def short_name(kernel: str) -> str:
    """A kernel's name without return type, template arguments and parameters:
    'void at::native::(anonymous namespace)::foo<float>(...)' -> 'at::native::anon::foo'."""
    name = re.sub(r"^(void |std::enable_if<.*?>::type )", "", kernel).replace(
        "(anonymous namespace)", "anon"
    )
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()[:80]


def labelled_kernels(trace: dict) -> list[tuple[str, float, float]]:
    """A chrome trace's GPU kernels as (name [grid] after previous, start, end) in µs; the label
    tells the projections of a layer apart."""
    ks = sorted(
        (e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"]
    )
    out, prev = [], "-"
    for e in ks:
        name = short_name(e["name"])
        grid = "x".join(map(str, e.get("args", {}).get("grid", [])))
        out.append((f"{name} [{grid}] after {prev}", e["ts"], e["ts"] + e["dur"]))
        prev = name
    return out


def traced_kernels(prof) -> list[tuple[str, float, float]]:
    """A finished torch.profiler run's GPU kernels, as labelled_kernels gives them."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            return labelled_kernels(json.load(trace))


def busy_per_call(fn, calls: int) -> dict[str, float]:
    """{label: busy µs it adds} per call of fn, over `calls` calls under torch.profiler (CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {k: us / calls for k, us in attribute_busy(traced_kernels(prof)).items()}


def gpu_profile(engine, steps: int, top: int = 15) -> dict:
    """Two windows of `steps` engine steps on a warm CUDA engine whose requests all keep decoding:
    one plain (tokens per second), one under torch.profiler (GPU busy time per step, the idle
    fraction, the kernels taking the most GPU time and the busy time each kernel adds beyond those
    started before it, per (kernel, grid, previous kernel))."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += len(engine.step())
    torch.cuda.synchronize()
    clean = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    critical = attribute_busy(traced_kernels(prof))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in kernels])
    per = {}
    for e in kernels:
        n, t = per.get(e.name, (0, 0.0))
        per[e.name] = (n + 1, t + e.time_range.elapsed_us())
    return {
        "steps": steps,
        "clean_ms_per_step": round(clean / steps * 1e3, 3),
        "tok_per_s": round(tokens / clean, 1),
        "wall_ms_per_step": round(wall / steps * 1e3, 3),
        "gpu_busy_ms_per_step": round(busy / steps / 1e3, 3),
        "gpu_idle_fraction": round(1 - busy / (wall * 1e6), 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "top": [
            {"kernel": k[:90], "per_step": round(n / steps, 1), "us_per_step": round(t / steps, 1)}
            for k, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "busy_by_kernel": [
            {"kernel": k, "us_per_step": round(t / steps, 1)}
            for k, t in sorted(critical.items(), key=lambda kv: -kv[1])[:top]
        ],
        "parts_us": {k: round(t / steps, 1) for k, t in by_part(critical).items()},
    }


def host_profile(engine, steps: int, device: str) -> tuple[float, pstats.Stats]:
    """`steps` engine steps under cProfile: (seconds per step, the profile)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    sync()
    prof.disable()
    return (time.perf_counter() - t0) / steps, pstats.Stats(prof)


def spec_counts(engine) -> tuple[int, int, int]:
    return engine.spec_rounds, engine.spec_drafts, engine.spec_accepted


def profile(args) -> None:
    """`rlt bench profile`: `--concurrency` requests decoding at once in one in-process worker
    engine; after their prefills and a warm-up (graph captures), `--gpu` (CUDA) profiles two windows
    of `--steps` loop steps (gpu_profile), then cProfile times `--steps` more (host_profile)."""
    import msgspec

    from rlt import envs
    from rlt.bench import floors, offline
    from rlt.bench.commands import exits
    from rlt.contract.config import EngineConfig
    from rlt.models.default_model import default_model_path
    from rlt.workers.engine import LoopEngine

    mc, dtype, model = offline.load(args.model or default_model_path(), args.device, args.dtype)
    if args.prefill:
        return prefill_profile(args, mc, dtype, model)
    cfg = EngineConfig(
        max_num_seqs=args.concurrency,
        kv_memory_bytes=int(args.kv_gib * 2**30),
        prefill_chunk=args.prompt_len,
        max_num_batched_tokens=max(args.prompt_len, 16384),
        kernels=args.kernels,
        steady_decode=args.steady_decode,
        exit_wait_passes=args.exit_wait_passes,
        speculative_loops=args.speculative_loops,
        **({"speculative_tokens": args.speculative_tokens} if args.speculative_tokens else {}),
    )
    eng = LoopEngine(mc, model, cfg, dtype, args.device)
    (threshold,) = exits(args.threshold)
    # a step outputs up to a round's tokens while speculating; its warm-up meets every round size
    most = 1 + (eng.cfg.speculative_tokens if args.speculative_loops else 0)
    warm = 8 * mc.depth * most
    # (outlasts the warm-up and every window)
    sp = offline.exit_params(threshold, max_tokens=(warm + 3 * args.steps) * most + 32)
    try:
        offline.check_pool(eng.pool, args.concurrency, args.prompt_len + sp.max_tokens)
    except offline.PoolTooSmall as e:
        raise SystemExit(f"{e}: raise --kv-gib (or lower --concurrency)") from None
    offline.submit(eng, mc, args.concurrency, args.prompt_len, sp, low=3)
    seen, tokens = set(), 0
    while len(seen) < args.concurrency:  # prefill: every request has its first token
        seen |= {o.request_id for o in eng.step()}
    for _ in range(warm):  # decode warm-up: graph captures happen here
        tokens += len(eng.step())
    res = {"concurrency": args.concurrency, "threshold": args.threshold}
    res["steady_decode"] = args.steady_decode
    spec0 = spec_counts(eng)
    if args.gpu:
        res |= gpu_profile(eng, args.steps, top=args.top)
        print(
            f"{args.steps} steps: {res['clean_ms_per_step']} ms per step "
            f"({res['tok_per_s']} tok/s), "
            f"profiled {res['wall_ms_per_step']} ms, GPU busy {res['gpu_busy_ms_per_step']} ms, "
            f"idle {res['gpu_idle_fraction']}, {res['kernels_per_step']} kernels per step"
        )
        print("busy time each kernel adds beyond those started before it, per step:")
        for k in res["busy_by_kernel"]:
            print(f"{k['us_per_step']:10.1f} us  {k['kernel']}")
        # (a row's context midway through the two windows: a loop step each row a step)
        context = args.prompt_len + 1 + tokens // args.concurrency + args.steps // mc.depth
        read = floors.read_gbps(torch.empty(1 << 30, dtype=torch.int16, device=args.device))
        roof = floors.decode_roofline(model, mc, args.concurrency, context, read)
        res |= {"read_gbps": read, "context": context}
        print("\n".join(decode_table(res["parts_us"], decode_bytes(roof, mc.depth), read)))
    per_step, stats = host_profile(eng, args.steps, args.device)
    res |= {"host_ms_per_step": round(per_step * 1e3, 3), "steady_steps": eng.steady_steps}
    res |= {"pdl": envs.pdl_enabled() if args.device.startswith("cuda") else None}
    rounds, drafts, accepted = (a - b for a, b in zip(spec_counts(eng), spec0))
    if rounds:
        res |= {"spec_rounds": rounds, "acceptance": round(accepted / max(drafts, 1), 3)}
        print(f"speculation: {rounds} rounds, acceptance {res['acceptance']}")
    at = f"{args.steps} steps at concurrency {args.concurrency}"
    print(f"{at}: {per_step * 1e3:.2f} ms per loop step (cProfile on)")
    stats.sort_stats("tottime").print_stats(args.top)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res | {"engine": msgspec.to_builtins(cfg)}, f, indent=2)


def prefill_profile(args, mc, dtype, model) -> None:
    """`--prefill N`: N new prompts of --prompt-len through an engine one at a time, after one to
    warm it, their GPU time by part against the same parts of the prompt's dense floor (CUDA)."""
    import itertools

    from rlt.bench import floors, offline

    if not args.device.startswith("cuda"):
        raise SystemExit("--prefill profiles the GPU's side of a prompt: it needs --device cuda")
    n = args.prompt_len
    engine = offline.prefill_engine(mc, model, dtype, args.device, n, kernels=args.kernels)
    g = torch.Generator().manual_seed(n)
    prompts = iter(torch.randint(0, mc.vocab_size, (args.prefill + 1, n), generator=g).tolist())
    ids = map(str, itertools.count())

    def one():
        offline.first_token(engine, mc, next(prompts), next(ids))

    one()
    engine_us = by_part(busy_per_call(one, args.prefill))
    floor_us = by_part(busy_per_call(floors.prefill_floor(model, mc, n), args.prefill))
    print("\n".join(prefill_table(engine_us, floor_us)))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"prompt_len": n, "parts_us": engine_us, "floor_parts_us": floor_us}, f)
