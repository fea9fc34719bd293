"""Where a decode stream's long inter-token gaps come from: closed loops into one in-process
LoopEngine (no HTTP, no worker processes), default options but --decode-pass-rows, each engine
step logged with what its pass carried.

    python scripts/pass_trace.py --model DIR --device cuda --values 8192,2048 --streams 64 \\
        --prompt-len 1024 --output-len 256 --requests 192 [--rules engine,batched,flat]

--packs gqa,1 A/Bs the general attention kernel's items: a GQA group's heads (the engine's) or one.
--rules A/Bs the engine's prompt budget (engine: decode_pass_rows, a pass's first prompt up to twice
that each time the decoding streams halve below max_num_seqs) against two variants: batched (every
prompt of the pass shares the doubled budget) and flat (never doubled). The closed loop's TTFT
depends on how its first wave's prefills are spread, the seed workload's on a 4,096-token prompt
going whole under light load.

Per value and rule: output tok/s, TTFT p50 (of all, of the first wave, of the later requests), the
passes carrying prompt rows (their time and rows), ITL p50 / p99 and p99 / p50 (as `rlt bench serve`
reports them, from each token's arrival on the host), then the steps ending the slowest 1 % of gaps:
each step's wall time, prompt rows and decode rows in flight, and whether it ran in steady decode,
so a scheduling policy for #34's decode tail can be chosen from how the long gaps are made.
"""

import argparse
import gc
import statistics
import time

import msgspec
import torch

from rlt.bench import offline
from rlt.bench.serving import percentile
from rlt.sampling_params import SamplingParams
from rlt.validation import resolve_params
from rlt.workers.backend import TritonBackend
from rlt.workers.engine import LoopEngine
from rlt.workers.first_use import FirstUse, count_triton_compiles
from rlt.workers.warmup import warm_up


def variant_budget(sched, rule: str):
    """The scheduler's (prompt budget, first prompt's budget) under a variant rule."""
    engine_rule = sched._prompt_budget

    pick = {"batched": lambda base, first: (first, first), "flat": lambda base, first: (base, base)}[rule]

    def prompt_budget(budget: int, in_flight: int) -> tuple[int, int]:
        return pick(*engine_rule(budget, in_flight))

    return prompt_budget


def run(args, mc, dtype, model, value: int, rule: str) -> None:
    cfg = msgspec.structs.replace(
        offline.engine_config(args.streams, args.prompt_len, args.kv_gib), decode_pass_rows=value
    )
    cfg = msgspec.structs.replace(cfg, max_num_batched_tokens=8192, prefill_chunk=8192)  # (the defaults)
    eng = LoopEngine(mc, model, cfg, dtype, args.device)
    warm_up(eng, log=lambda line: None)  # (as a worker does before READY)
    if rule != "engine":
        eng.sched._prompt_budget = variant_budget(eng.sched, rule)
    built = FirstUse.compiles, FirstUse.captures
    carried = [0, 0]  # the regular pass's prompt rows and decode rows (steady decode: none)
    runner_step = eng.runner.step

    def traced(groups):
        carried[:] = [sum(g.n for g in groups if not g.decoding), sum(g.decoding for g in groups)]
        return runner_step(groups)

    eng.runner.step = traced
    gen = torch.Generator().manual_seed(0)
    sp = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    sent, start, last, ttft, itl, steps = 0, {}, {}, {}, [], []
    gaps = []  # (gap ms, index of the step that ended it)

    def submit() -> None:
        nonlocal sent
        prompt = torch.randint(3, mc.vocab_size, (args.prompt_len,), generator=gen).tolist()
        eng.add_request(sent, prompt, resolve_params(mc, args.prompt_len, sp))
        start[sent] = time.perf_counter()
        sent += 1

    for _ in range(args.streams):
        submit()
    tokens, t0 = 0, time.perf_counter()
    while eng.has_work():
        carried[:] = [0, 0]
        a = time.perf_counter()
        outs = eng.step()
        now = time.perf_counter()
        steps.append((round((now - a) * 1e3, 2), *carried, eng._steady is not None))
        for o in outs:
            tokens += 1
            r = o.request_id
            if r in last:
                itl.append((now - last[r]) * 1e3)
                gaps.append((itl[-1], len(steps) - 1))
            else:
                ttft[r] = (now - start[r]) * 1e3
            last[r] = now
            if o.finish_reason is not None and sent < args.requests:
                submit()
    wall = time.perf_counter() - t0
    p50, p99 = statistics.median(itl), percentile(itl, 99)
    first = [t for r, t in ttft.items() if r < args.streams]
    later = [t for r, t in ttft.items() if r >= args.streams] or [0.0]
    prompt_steps = [s for s in steps if s[1]]
    print(
        f"decode_pass_rows {value}, {rule}: {tokens / wall:.1f} tok/s, TTFT p50 "
        f"{statistics.median(ttft.values()):.1f} ms (first wave {statistics.median(first):.1f}, later "
        f"{statistics.median(later):.1f}), {len(prompt_steps)} passes with prompt rows "
        f"({sum(s[0] for s in prompt_steps):.0f} ms, {sum(s[1] for s in prompt_steps)} rows), "
        f"ITL p50 {p50:.2f} / p99 {p99:.2f} ms ({p99 / p50:.2f}), {len(steps)} steps, "
        f"{sum(s[3] for s in steps)} in steady decode, {FirstUse.compiles - built[0]} compiles and "
        f"{FirstUse.captures - built[1]} captures after the warm-up",
        flush=True,
    )
    worst = sorted({i for g, i in gaps if g >= p99})
    print("  steps ending the slowest gaps (step: ms, prompt rows, decode rows, steady), with the 4 before:")
    for i in worst[: args.show]:
        print(f"  {i}: " + " | ".join(f"{steps[j]}" for j in range(max(0, i - 4), i + 1)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--values", default="8192,2048", help="decode_pass_rows values")
    p.add_argument("--rules", default="engine", help="prompt budget variants (see above)")
    p.add_argument(
        "--packs", default="gqa", help="gqa (the engine's), 1: a GQA group's heads per attention item or one"
    )
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--requests", type=int, default=192)
    p.add_argument("--kv-gib", type=float, default=110, help="KV pool (an H200 worker sizes ~120 GiB; less preempts)")
    p.add_argument("--show", type=int, default=12, help="slow gaps to print")
    args = p.parse_args()
    count_triton_compiles()
    mc, dtype, model = offline.load(args.model, args.device)
    variants = [
        (v, r, k)
        for v in map(int, args.values.split(","))
        for r in args.rules.split(",")
        for k in args.packs.split(",")
    ]
    for value, rule, pack in variants:
        TritonBackend.packs_gqa = pack == "gqa"
        print(f"attention items: {'a GQA group of heads' if pack == 'gqa' else 'one head'}", flush=True)
        run(args, mc, dtype, model, value, rule)
        gc.collect()  # (the engine's KV pool, before the next one takes its own)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
