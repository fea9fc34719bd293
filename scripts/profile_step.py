"""Where a decode step's time goes: cProfile over engine steps (any device), and with --gpu first
the GPU's side (CUDA: ms per step clean and profiled, GPU busy per step, the idle share, kernels per
step, the kernels adding the most busy time).

python scripts/profile_step.py --model DIR --device cuda --concurrency 64 --prompt-len 256 \
    --threshold latent-diff:1.15 --exit-wait-passes 8 --steps 100 --gpu
"""

import argparse

from rlt.bench import offline
from rlt.bench.commands import exits
from rlt.bench.profile import gpu_profile, host_profile
from rlt.config import EngineConfig
from rlt.workers.engine import LoopEngine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--threshold", default="1.0", help="as rlt bench offline's: 0.5, latent-diff:0.5, depth:8")
    ap.add_argument("--exit-wait-passes", type=int, default=0)
    ap.add_argument("--kv-gib", type=float, default=20)
    ap.add_argument("--kernels", choices=("triton", "reference"), default="triton")
    ap.add_argument("--gpu", action="store_true", help="also the GPU's side of the steps (CUDA)")
    args = ap.parse_args()
    mc, dtype, model = offline.load(args.model, args.device)
    eng = LoopEngine(
        mc,
        model,
        EngineConfig(
            max_num_seqs=args.concurrency,
            kv_memory_bytes=int(args.kv_gib * 2**30),
            prefill_chunk=args.prompt_len,
            max_num_batched_tokens=16384,
            kernels=args.kernels,
            exit_wait_passes=args.exit_wait_passes,
        ),
        dtype,
        args.device,
    )
    (threshold,) = exits(args.threshold)
    sp = offline.exit_params(threshold, max_tokens=2000)
    offline.submit(eng, mc, args.concurrency, args.prompt_len, sp, low=3)
    for _ in range(3 * mc.depth + 8):  # prefill and graph capture happen here
        eng.step()
    if args.gpu:
        r = gpu_profile(eng, args.steps, top=args.top)
        print(
            f"{args.steps} steps: {r['clean_ms_per_step']} ms per step ({r['tok_per_s']} tok/s), profiled "
            f"{r['wall_ms_per_step']} ms, GPU busy {r['gpu_busy_ms_per_step']} ms, idle {r['gpu_idle_fraction']}, "
            f"{r['kernels_per_step']} kernels per step"
        )
        for k in r["busy_by_kernel"]:
            print(f"{k['us_per_step']:10.1f} us  {k['kernel']}")
    per_step, stats = host_profile(eng, args.steps, args.device)
    print(f"{args.steps} steps at concurrency {args.concurrency}: {per_step * 1e3:.2f} ms per loop step (cProfile on)")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
