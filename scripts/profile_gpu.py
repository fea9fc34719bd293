"""Where a decode step's GPU time goes, and how much of the wall time the GPU is idle (issue #6).

    python scripts/profile_gpu.py --model DIR --concurrency 1 --steps 40

Every request decodes at once (none finishes during the measurement). After warm-up, a timed
window of loop steps gives tokens/s at exactly this concurrency; a second window under
torch.profiler gives GPU busy time per step (the union of kernel intervals), the idle fraction and
the kernels taking the most GPU time. Kernels overlap under programmatic dependent launch (each
starts before the previous one ends), so their durations overstate their cost; the busy time is
also split among them — each gets the part of its interval no kernel started before it covers —
per (kernel, grid, previous kernel), which tells the projections of a layer apart.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from rlt.config import ModelConfig  # noqa: E402
from rlt.control.validation import resolve_params  # noqa: E402
from rlt.models.loader import load_model, resolve_dtype  # noqa: E402
from rlt.sampling_params import SamplingParams  # noqa: E402
from rlt.workers.engine import EngineConfig, LoopEngine  # noqa: E402


def busy_us(intervals: list[tuple[float, float]]) -> float:
    return sum(attribute_busy([("", a, b) for a, b in intervals]).values())


def attribute_busy(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """(label, start, end) intervals -> {label: busy time it adds}: in start order, each kernel
    gets the part of its interval past the latest end of the kernels before it (their union is
    the busy time; idle gaps go to no one)."""
    out, end = {}, float("-inf")
    for label, a, b in sorted(kernels, key=lambda k: k[1]):
        out[label] = out.get(label, 0.0) + max(0.0, b - max(a, end))
        end = max(end, b)
    return out


def short_name(kernel: str) -> str:
    """A kernel's name without return type, template arguments and parameters:
    'void at::native::(anonymous namespace)::foo<float>(...)' -> 'at::native::anon::foo'."""
    name = re.sub(r"^(void |std::enable_if<.*?>::type )", "", kernel).replace("(anonymous namespace)", "anon")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()[:80]


def labelled_kernels(trace: dict) -> list[tuple[str, float, float]]:
    """A chrome trace's GPU kernels as (name [grid] after previous, start, end) in µs."""
    ks = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out, prev = [], "-"
    for e in ks:
        name = short_name(e["name"])
        grid = "x".join(map(str, e.get("args", {}).get("grid", [])))
        out.append((f"{name} [{grid}] after {prev}", e["ts"], e["ts"] + e["dur"]))
        prev = name
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--threshold", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kv-gib", type=float, default=60)
    ap.add_argument("--steady-decode", type=int, choices=(0, 1, 2), default=1,
                    help="0: regular path only; 1: steady decode where a request can exit early (the default); "
                         "2: also at fixed depth")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    mc = ModelConfig.from_pretrained(args.model)
    dtype = resolve_dtype(None, "cuda", mc)
    model = load_model(mc, dtype, "cuda")
    eng = LoopEngine(mc, model, EngineConfig(max_num_seqs=args.concurrency, kv_memory_bytes=int(args.kv_gib * 2**30),
                                             prefill_chunk=args.prompt_len, max_num_batched_tokens=16384,
                                             steady_decode=args.steady_decode > 0,
                                             steady_fixed_depth=args.steady_decode == 2), dtype, "cuda")
    sp = SamplingParams(max_tokens=2 * args.steps + 16 * mc.depth + 32, temperature=0, ignore_eos=True, exit_threshold=args.threshold)
    from bench import check_pool, kernel_choices

    check_pool(eng.pool, args.concurrency, args.prompt_len + sp.max_tokens)
    g = torch.Generator().manual_seed(0)
    for i in range(args.concurrency):
        p = torch.randint(3, mc.vocab_size, (args.prompt_len,), generator=g).tolist()
        eng.add_request(str(i), p, resolve_params(mc, len(p), sp))
    seen = set()
    while len(seen) < args.concurrency:  # prefill
        seen |= {o.request_id for o in eng.step()}
    for _ in range(8 * mc.depth):  # decode warm-up: graph capture
        eng.step()
    torch.cuda.synchronize()
    t0, tokens = time.perf_counter(), 0  # a timed window without the profiler: tokens per second
    for _ in range(args.steps):
        tokens += len(eng.step())
    torch.cuda.synchronize()
    clean = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            critical = attribute_busy(labelled_kernels(json.load(trace)))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_us([(e.time_range.start, e.time_range.end) for e in kernels])
    per = {}
    for e in kernels:
        n, t = per.get(e.name, (0, 0.0))
        per[e.name] = (n + 1, t + e.time_range.elapsed_us())
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:15]
    res = {"concurrency": args.concurrency, "threshold": args.threshold, "steps": args.steps,
           "steady_decode": args.steady_decode, "steady_steps": eng.steady_steps,
           "clean_ms_per_step": round(clean / args.steps * 1e3, 3), "tok_per_s": round(tokens / clean, 1),
           "wall_ms_per_step": round(wall / args.steps * 1e3, 3), "gpu_busy_ms_per_step": round(busy / args.steps / 1e3, 3),
           "gpu_idle_fraction": round(1 - busy / (wall * 1e6), 3), "kernels_per_step": round(len(kernels) / args.steps, 1),
           "top": [{"kernel": k[:90], "per_step": round(n / args.steps, 1), "us_per_step": round(t / args.steps, 1)}
                   for k, (n, t) in top],
           "busy_by_kernel": [{"kernel": k, "us_per_step": round(t / args.steps, 1)}
                              for k, t in sorted(critical.items(), key=lambda kv: -kv[1])[:15]]}
    res |= kernel_choices("cuda")  # the one-row GEMV setup; PDL on or off
    print(f"concurrency {args.concurrency}, threshold {args.threshold}: {res['tok_per_s']} tok/s, "
          f"{res['clean_ms_per_step']} ms per loop step ({res['wall_ms_per_step']} under the profiler), "
          f"GPU busy {res['gpu_busy_ms_per_step']} ms ({res['kernels_per_step']} kernels), "
          f"idle {res['gpu_idle_fraction'] * 100:.1f} %; PDL {'on' if res['pdl'] else 'off'}; GEMV {res['gemv']}")
    for r in res["top"]:
        print(f"  {r['us_per_step']:>9} us  x{r['per_step']:>6}  {r['kernel']}")
    print("busy time each kernel adds beyond those started before it, per step:")
    for r in res["busy_by_kernel"]:
        print(f"  {r['us_per_step']:>9} us  {r['kernel']}")

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
