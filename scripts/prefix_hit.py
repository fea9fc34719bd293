"""Where a prefix hit's time goes, against its in-run floor:

    python scripts/prefix_hit.py --model /tmp/nb-full --prefix-len 4096 --new-len 128

One LoopEngine in process (default options, a fixed KV pool). Per repetition a fresh first turn
of --prefix-len tokens (cached as it finishes), then that prefix + --new-len new tokens: the time
from submission to its first token (lookup, block tables, the passes over the new rows, the token's
read-back), with each step's host time. Cold: --new-len tokens alone. Then one hit under
torch.profiler (GPU busy time, idle gaps, the kernels and host operations taking the most time,
and its timeline: when the GPU first and last worked and each engine step's host span, from the
submission). The floor (rlt/bench/floors.py: the GEMMs over the new rows and attention over the
whole context, at every loop, and the head's row) is replayed after each hit, both taken as
medians: a drift in the GPU's clocks reaches both. --prefix-len 0: a lone prompt of --new-len
tokens against its dense floor.
"""

import argparse
import contextlib
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rlt.bench import floors, offline
from rlt.bench.profile import attribute_busy, busy_us, labelled_kernels
from rlt.config import EngineConfig
from rlt.sampling_params import SamplingParams
from rlt.validation import resolve_params
from rlt.workers.engine import LoopEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--new-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--kv-gib", type=float, default=20)
    ap.add_argument("--json-out")
    ap.add_argument("--host-profile", type=int, default=0, help="cProfile one more hit: print this many functions")
    args = ap.parse_args()
    mc, dtype, model = offline.load(args.model, args.device)
    eng = LoopEngine(mc, model, EngineConfig(kv_memory_bytes=int(args.kv_gib * 2**30)), dtype, args.device)
    gen = torch.Generator().manual_seed(0)
    sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    count = iter(range(1 << 30))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def tokens(n):
        return torch.randint(3, mc.vocab_size, (n,), generator=gen).tolist()

    def first_token(prompt) -> tuple[float, list[float]]:
        """ms to the first token, and each step's host ms (named ranges for a profiler's timeline)."""
        sync()
        t0 = time.perf_counter()
        with record_function("to the first token"):
            eng.add_request(next(count), prompt, resolve_params(mc, len(prompt), sp))
            steps = []
            while True:
                t = time.perf_counter()
                with record_function(f"engine step {len(steps)}"):
                    done = eng.step()
                steps.append((time.perf_counter() - t) * 1e3)
                if done:
                    break
        ms = (time.perf_counter() - t0) * 1e3
        while eng.has_work():
            eng.step()
        return ms, steps

    def hit(around=contextlib.nullcontext) -> tuple[float, list[float]]:
        """A first turn, then (within `around`) its prefix and new tokens."""
        prefix = tokens(args.prefix_len)
        if prefix:
            first_token(prefix)
        before = eng.pool.prefix.hit_tokens
        with around():
            out = first_token(prefix + tokens(args.new_len))
        assert eng.pool.prefix.hit_tokens - before == args.prefix_len, "no prefix hit"
        return out

    for _ in range(2):  # warm-up: graphs and kernels for these shapes
        hit()
        first_token(tokens(args.new_len))
    floor_once = (
        floors.prefill_floor(model, mc, args.new_len, args.prefix_len + args.new_len)
        if args.device.startswith("cuda")
        else lambda: float("nan")
    )
    hits, floor_runs = [], []
    for _ in range(args.repeat):
        hits.append(hit())
        floor_runs.append(floor_once())
    cold = [first_token(tokens(args.new_len))[0] for _ in range(args.repeat)]
    if args.host_profile:  # where a hit's host time goes (Python frames, by own time)
        import cProfile
        import pstats

        pr = cProfile.Profile()
        hit(lambda: pr)  # (the hit's own turn only)
        for key in ("tottime", "cumulative"):
            pstats.Stats(pr).sort_stats(key).print_stats(args.host_profile)
    ms = statistics.median(h[0] for h in hits)

    prefix = tokens(args.prefix_len)
    if prefix:
        first_token(prefix)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        first_token(prefix + tokens(args.new_len))
        wall = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e3
    prof.export_chrome_trace("/tmp/prefix_hit_trace.json")
    with open("/tmp/prefix_hit_trace.json") as f:
        trace = json.load(f)
    labelled = labelled_kernels(trace)
    # the timeline from submission to the first token: when the GPU first and last worked (kernels,
    # copies), each engine step's host span, in ms from the submission
    ranges = {
        e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
    }
    t_sub, t_done = ranges["to the first token"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]
    gpu = [(a, b) for a, b in gpu if t_sub <= a <= t_done]
    timeline = (
        {
            "gpu_first_ms": round((min(a for a, _ in gpu) - t_sub) / 1e3, 2),
            "gpu_last_end_ms": round((max(b for _, b in gpu) - t_sub) / 1e3, 2),
            "done_ms": round((t_done - t_sub) / 1e3, 2),
            "steps_ms": {
                n: [round((a - t_sub) / 1e3, 2), round((b - t_sub) / 1e3, 2)]
                for n, (a, b) in ranges.items()
                if n.startswith("engine step")
            },
        }
        if gpu
        else {}
    )
    by_kernel = attribute_busy(labelled)
    gaps, end = [], None  # idle stretches between kernels: (µs, the kernel after)
    for label, a, b in labelled:
        if end is not None and a > end:
            gaps.append((a - end, label))
        end = b if end is None else max(end, b)
    host = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    del prof
    floor = statistics.median(floor_runs)
    res = {
        "prefix_len": args.prefix_len,
        "new_len": args.new_len,
        "hit_ms": [round(h[0], 2) for h in hits],
        "hit_ms_median": round(ms, 2),
        "hit_step_host_ms": [round(t, 2) for t in sorted(hits)[len(hits) // 2][1]],  # (the median run's)
        "cold_new_len_ms_median": round(statistics.median(cold), 2),
        "floor_ms": round(floor, 2),
        "floor_ms_runs": [round(f, 2) for f in floor_runs],
        "x_floor": round(ms / floor, 2),
        "profiled_wall_ms": round(wall, 2),
        "profiled_gpu_busy_ms": round(busy, 2),
        "kernels": len(kernels),
        # between the first kernel and the last: launch gaps (< 20 µs each) and longer waits
        "profiled_timeline": timeline,
        "idle_short_gaps_ms": round(sum(g for g, _ in gaps if g < 20) / 1e3, 2),
        "idle_long_gaps": [(round(g, 1), label) for g, label in sorted(gaps, reverse=True)[:6] if g >= 20],
        "busy_by_kernel_us": {k: round(v, 1) for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:20]},
    }
    print(json.dumps(res, indent=1))
    print(host)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res | {"host_ops": host}, f, indent=1)


if __name__ == "__main__":
    main()
