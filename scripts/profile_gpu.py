"""Where a decode step's GPU time goes, and how much of the wall time the GPU is idle.

    python scripts/profile_gpu.py --model DIR --concurrency 1 --steps 40

Every request decodes at once (none finishes during the measurement). After warm-up, a timed
window of loop steps gives tokens/s at exactly this concurrency; a second window under
torch.profiler gives GPU busy time per step (the union of kernel intervals), the idle fraction and
the kernels taking the most GPU time. Kernels overlap under programmatic dependent launch (each
starts before the previous one ends), so their durations overstate their cost; the busy time is
also split among them — each gets the part of its interval no kernel started before it covers —
per (kernel, grid, previous kernel), which tells the projections of a layer apart. The
measurement is rlt/bench/profile.py.
"""

import argparse
import json

import msgspec

from rlt import envs
from rlt.bench import offline
from rlt.bench.profile import gpu_profile
from rlt.config import EngineConfig
from rlt.sampling_params import SamplingParams
from rlt.workers.engine import LoopEngine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--threshold", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kv-gib", type=float, default=60)
    ap.add_argument("--kernels", choices=("triton", "reference"), default="triton")
    ap.add_argument(
        "--steady-decode",
        choices=("adaptive", "always", "never"),
        default="adaptive",
        help="device-side decode lanes: where a request can exit early (the default), always, never",
    )
    ap.add_argument("--json-out")
    args = ap.parse_args()
    mc, dtype, model = offline.load(args.model, "cuda")
    cfg = EngineConfig(
        max_num_seqs=args.concurrency,
        kv_memory_bytes=int(args.kv_gib * 2**30),
        prefill_chunk=args.prompt_len,
        max_num_batched_tokens=16384,
        kernels=args.kernels,
        steady_decode=args.steady_decode,
    )
    eng = LoopEngine(mc, model, cfg, dtype, "cuda")
    sp = SamplingParams(
        max_tokens=2 * args.steps + 16 * mc.depth + 32, temperature=0, ignore_eos=True, exit_threshold=args.threshold
    )
    try:
        offline.check_pool(eng.pool, args.concurrency, args.prompt_len + sp.max_tokens)
    except offline.PoolTooSmall as e:
        raise SystemExit(f"{e}: raise --kv-gib (or lower --concurrency)") from None
    offline.submit(eng, mc, args.concurrency, args.prompt_len, sp, low=3)
    seen = set()
    while len(seen) < args.concurrency:  # prefill
        seen |= {o.request_id for o in eng.step()}
    for _ in range(8 * mc.depth):  # decode warm-up: graph capture
        eng.step()
    res = {
        "concurrency": args.concurrency,
        "threshold": args.threshold,
        **gpu_profile(eng, args.steps),
        "steady_decode": args.steady_decode,
        "steady_steps": eng.steady_steps,
        "pdl": envs.pdl_enabled(),
        "engine": msgspec.to_builtins(cfg),
    }
    print(
        f"concurrency {args.concurrency}, threshold {args.threshold}: {res['tok_per_s']} tok/s, "
        f"{res['clean_ms_per_step']} ms per loop step ({res['wall_ms_per_step']} under the profiler), "
        f"GPU busy {res['gpu_busy_ms_per_step']} ms ({res['kernels_per_step']} kernels), "
        f"idle {res['gpu_idle_fraction'] * 100:.1f} %; PDL {'on' if res['pdl'] else 'off'}; "
        f"steady decode {args.steady_decode} ({res['steady_steps']} steady steps)"
    )
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
