"""Benchmarks. Offline (default): decode throughput of the loop-level engine (CPU or one GPU).

    python scripts/bench.py --family ouro --preset tiny --concurrency 1,16 --threshold 1.0,0.5

Serving (`--mode serve`, scripts/bench_serving.py): Poisson arrivals (or a closed loop) into
rlt.Engine in process, or over HTTP into any OpenAI-compatible server (`--base-url`), with vLLM's
metric names.

Makes (or reuses) a random-weight checkpoint, submits `concurrency` requests at once (random
prompts, greedy, EOS ignored) and reports output tokens per second over the whole run (prefill
included) and over the decode phase alone, with the mean exit depth of decode tokens.
`--prefill-lens` adds prefill latency (one prompt, submission to first token) by prompt length;
on CUDA `--floors` measures the ceilings in the same run (rlt/bench/floors.py) and reports each
result as a fraction of its floor: decode (at full concurrency: until the first request finishes)
against the HBM roofline at the row's concurrency and mean context, prefill against the same
GEMMs + SDPA in plain torch. The measurement is rlt/bench/offline.py.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import msgspec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import bench_serving  # noqa: E402

from rlt.bench import offline  # noqa: E402
from rlt.models.checkpoint import make_checkpoint  # noqa: E402
from rlt.workers.engine import LoopEngine  # noqa: E402


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["offline", "serve"], default="offline")
    ap.add_argument("--model")
    ap.add_argument("--family", default="ouro")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--threshold", default="1.0,0.5")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-layout", default="last_exited")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype")
    ap.add_argument("--kv-gib", type=float, help="KV pool size (offline default 1; serve: the engine's default)")
    ap.add_argument(
        "--kernels",
        choices=("triton", "reference"),
        default="triton",
        help="CUDA: the Triton kernels and CUDA graphs, or the plain torch reference",
    )
    ap.add_argument("--cuda-graph-max-batch", type=int, default=256, help="0: eager decode")
    ap.add_argument(
        "--steady-decode",
        choices=("adaptive", "always", "never"),
        default="adaptive",
        help="device-side decode lanes: where a request can exit early (the default), always, never",
    )
    ap.add_argument(
        "--penalties",
        action="store_true",
        help="each decode row twice: unpenalized, then every request penalized (repetition 1.1, presence "
        "0.5, frequency 0.5), with the penalized/unpenalized ratio of decode tok/s",
    )
    ap.add_argument("--prefill-lens", default="", help="e.g. 512,1024,4096: prefill latency by prompt length")
    ap.add_argument("--floors", action="store_true", help="CUDA: measure ceilings and floors in the same run")
    ap.add_argument("--commit", default=None, help="recorded in the JSON (default: git rev-parse --short HEAD)")
    ap.add_argument("--json-out")
    bench_serving.add_arguments(ap.add_argument_group("serve mode (scripts/bench_serving.py)"))
    args = ap.parse_args()
    args.commit = args.commit or git_commit()
    if args.mode == "serve":
        if args.model is None:
            from rlt.default_model import default_model_path

            args.model = default_model_path()
        bench_serving.main(args)
        return
    path = args.model or os.path.join(os.path.expanduser("~/.cache/rlt/bench"), f"{args.family}-{args.preset}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        make_checkpoint(args.family, path, preset=args.preset)
    mc, dtype, model = offline.load(path, args.device, args.dtype)
    concs = list(map(int, filter(None, args.concurrency.split(","))))
    thresholds = list(map(float, args.threshold.split(",")))
    cfg = offline.engine_config(
        max(concs, default=1),
        args.prompt_len,
        args.kv_gib or 1.0,
        kv_layout=args.kv_layout,
        cuda_graph_max_batch=args.cuda_graph_max_batch,
        steady_decode=args.steady_decode,
        kernels=args.kernels,
    )
    rows = []
    if concs:
        engine = LoopEngine(mc, model, cfg, dtype, args.device)
        try:
            variants = (False, True) if args.penalties else (False,)
            rows = offline.decode_rows(engine, mc, concs, thresholds, args.prompt_len, args.max_tokens, variants)
        except offline.PoolTooSmall as e:
            raise SystemExit(f"{e}: raise --kv-gib (or lower --concurrency)") from None
        del engine
    prefill = []
    for n in map(int, filter(None, args.prefill_lens.split(","))):
        ms = offline.prefill_ms(mc, model, dtype, args.device, n, kernels=args.kernels)
        prefill.append({"prompt_len": n, "ms": round(ms, 2)})
    ceilings = None
    if args.floors and args.device.startswith("cuda"):
        ceilings = offline.against_floors(
            rows, prefill, model, mc, args.device, context=args.prompt_len + args.max_tokens // 2
        )
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": args.commit,
        **offline.environment(args.device),
        "model": args.model or f"{args.family}-{args.preset}",
        "family": mc.family,
        "dtype": str(dtype).replace("torch.", ""),
        "device": args.device,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "command": " ".join(sys.argv),
        "engine": msgspec.to_builtins(cfg),
        "ceilings": ceilings,
    }
    print(json.dumps(meta))
    print(
        f"{'conc':>5} {'thr':>5} {'pen':>4} {'tok/s':>9} {'decode tok/s':>13} {'at full conc':>13} {'its depth':>10} "
        f"{'mean depth':>11} {'total s':>8} {'roofline':>9} {'of roof':>8}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5} {r['threshold']:>5} {'yes' if r['penalized'] else 'no':>4} {r['tok_per_s']:>9} "
            f"{str(r['decode_tok_per_s']):>13} "
            f"{str(r['full_conc_tok_per_s']):>13} {str(r['full_conc_mean_depth']):>10} "
            f"{str(r['mean_decode_depth']):>11} {r['total_s']:>8} "
            f"{str(r.get('roofline_tok_per_s', '')):>9} {str(r.get('of_roofline', '')):>8}"
        )
    for plain, pen in zip(rows[::2], rows[1::2]) if args.penalties else ():
        ratios = [
            pen[k] / plain[k] if pen[k] and plain[k] else None for k in ("decode_tok_per_s", "full_conc_tok_per_s")
        ]
        print(
            f"penalized / unpenalized, conc {plain['concurrency']} thr {plain['threshold']}: decode tok/s "
            + ", at full conc ".join("-" if x is None else f"{x:.3f}" for x in ratios)
        )
    for p in prefill:
        print(
            f"prefill {p['prompt_len']:>6} tokens: {p['ms']:>9} ms"
            + (f"   dense floor {p['floor_ms']} ms   x{p['x_floor']}" if "floor_ms" in p else "")
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "prefill": prefill}, f, indent=2)


if __name__ == "__main__":
    main()
