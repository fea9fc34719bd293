"""Benchmarks. Offline (default): decode throughput of the loop-level engine (CPU or one GPU).

    python scripts/bench.py --family ouro --preset tiny --concurrency 1,16 --threshold 1.0,0.5

Serving (`--mode serve`, scripts/bench_serving.py): Poisson arrivals into rlt.Engine with vLLM's
metric names.

Makes (or reuses) a random-weight checkpoint, submits `concurrency` requests at once (random
prompts, greedy, EOS ignored) and reports output tokens per second over the whole run (prefill
included) and over the decode phase alone, with the mean exit depth of decode tokens.
`--prefill-lens` adds prefill latency (one prompt, submission to first token) by prompt length;
on CUDA `--floors` measures the ceilings in the same run (scripts/floors.py) and reports each
result as a fraction of its floor: decode (at full concurrency: until the first request finishes)
against the HBM roofline at the row's concurrency and mean context, prefill against the same
GEMMs + SDPA in plain torch.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from rlt.config import ModelConfig  # noqa: E402
from rlt.control.validation import resolve_params  # noqa: E402
from rlt.models.checkpoint import make_checkpoint  # noqa: E402
from rlt.models.loader import load_model, resolve_dtype  # noqa: E402
from rlt.sampling_params import SamplingParams  # noqa: E402
from rlt.workers.engine import EngineConfig, LoopEngine  # noqa: E402


def make_engine(mc, model, dtype, device, max_conc, prompt_len, layout, kv_gib, graphs, steady=1):
    return LoopEngine(mc, model, EngineConfig(kv_layout=layout, max_num_seqs=max(max_conc, 1),
                                              max_num_batched_tokens=max(2048, min(prompt_len * max_conc, 16384)),
                                              prefill_chunk=prompt_len, kv_memory_bytes=int(kv_gib * 2**30),
                                              cuda_graph_max_batch=graphs, steady_decode=steady > 0,
                                              steady_fixed_depth=steady == 2), dtype, device)


def check_pool(pool, concurrency: int, positions: int) -> None:
    """The pool must hold every sequence at once, or the run measures a lower concurrency."""
    need = concurrency * pool.blocks_needed(positions)
    if need > pool.num_blocks:
        raise SystemExit(f"the KV pool holds {pool.num_blocks} blocks; concurrency {concurrency} x {positions} "
                         f"positions needs {need}: raise --kv-gib (or lower --concurrency)")


def run_once(engine, mc, device, concurrency, threshold, prompt_len, max_tokens):
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, exit_threshold=threshold)
    for i in range(concurrency):
        prompt = torch.randint(0, mc.vocab_size, (prompt_len,), generator=g).tolist()
        engine.add_request(str(i), prompt, resolve_params(mc, prompt_len, sp))
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

    return {"concurrency": concurrency, "threshold": threshold, "output_tokens": tokens,
            "total_s": round(t1 - t0, 3), "tok_per_s": round(tokens / (t1 - t0), 2),
            "decode_tok_per_s": rate(decode_tokens, t1 - decode_t0),
            # decode while every request is still running: the rate at exactly `concurrency`
            "full_conc_tok_per_s": rate(full_tokens - decode_tokens0, full_t1 - decode_t0) if full_t1 else None,
            "mean_decode_depth": round(sum(depths) / len(depths), 2) if depths else None,
            # the tokens of that window: with exits, shallow requests make more of them, so the
            # depth-ratio ideal for the window's rate is 4 / this, not 4 / the run's mean
            "full_conc_mean_depth": round(sum(full_depths) / len(full_depths), 2) if full_depths else None}


def prefill_ms(mc, model, dtype, device, n, reps=3):
    """Median time from submission to the first token of one n-token prompt in one chunk."""
    engine = LoopEngine(mc, model, EngineConfig(max_num_seqs=1, max_num_batched_tokens=n, prefill_chunk=n,
                                                num_blocks=-(-n // 16) * mc.depth + 64), dtype, device)
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = torch.randint(0, mc.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    times = []
    for i in range(reps + 1):  # the first is warm-up (compilation)
        engine.add_request(str(i), prompt, resolve_params(mc, n, sp))
        t0 = time.perf_counter()
        while not engine.step():
            pass
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times[1:])[reps // 2]


def kernel_choices(device: str) -> dict | None:
    """On CUDA: the one-row GEMV's config and epilogues (RLT_GEMV_CONFIG, RLT_FUSED_GEMV,
    RLT_FUSED_GATE), the decode attention's forced key slices (RLT_DECODE_SPLITS) and programmatic
    dependent launch (RLT_PDL, RLT_PDL_RELEASE_FIRST)."""
    if not device.startswith("cuda"):
        return None
    from rlt.kernels import decode_attention, gemv, pdl

    return {"gemv": gemv.choices(), "decode_splits": decode_attention.FORCED_SPLITS, "pdl": pdl.enabled,
            "pdl_release_first": pdl.release_first}


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
    ap.add_argument("--kv-gib", type=float, default=1.0, help="KV pool size")
    ap.add_argument("--cuda-graph-max-batch", type=int, default=256, help="0: eager decode")
    ap.add_argument("--steady-decode", type=int, choices=(0, 1, 2), default=1,
                    help="0: regular path only; 1: steady decode where a request can exit early (the default); "
                         "2: also at fixed depth")
    ap.add_argument("--prefill-lens", default="", help="e.g. 512,1024,4096: prefill latency by prompt length")
    ap.add_argument("--floors", action="store_true", help="CUDA: measure ceilings and floors in the same run")
    ap.add_argument("--json-out")
    serve = ap.add_argument_group("serve mode (scripts/bench_serving.py)")
    serve.add_argument("--topology", default="single")
    serve.add_argument("--rates", default="0.25,0.5,1")
    serve.add_argument("--duration", type=float, default=60.0)
    serve.add_argument("--prompt-lens", default="128,4096")
    serve.add_argument("--output-len", type=int, default=64)
    serve.add_argument("--prefill-chunk", type=int, default=512)
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--sweep-rates", default="",
                       help="e.g. 2,4,6,8: after --rates, these in order until one is past capacity")
    serve.add_argument("--sweep-duration", type=float, help="seconds of arrivals per sweep rate (default --duration)")
    serve.add_argument("--max-local-prefill-length", type=int, help="PD: conditional disaggregation (README)")
    serve.add_argument("--max-prefill-queue-size", type=int, help="PD: conditional disaggregation (README)")
    serve.add_argument("--prefill-worker-chunk", type=int, help="PD: prompt rows per chunk on prefill workers (README)")
    args = ap.parse_args()
    if args.mode == "serve":
        import bench_serving

        if args.model is None:
            from rlt.default_model import default_model_path

            args.model = default_model_path()
        bench_serving.main(args)
        return
    path = args.model or os.path.join(os.path.expanduser("~/.cache/rlt/bench"), f"{args.family}-{args.preset}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        make_checkpoint(args.family, path, preset=args.preset)
    mc = ModelConfig.from_pretrained(path)
    dtype = resolve_dtype(args.dtype, args.device, mc)
    model = load_model(mc, dtype, args.device)
    concs = list(map(int, filter(None, args.concurrency.split(","))))
    thresholds = list(map(float, args.threshold.split(",")))
    engine = make_engine(mc, model, dtype, args.device, max(concs, default=1), args.prompt_len, args.kv_layout,
                         args.kv_gib, args.cuda_graph_max_batch, args.steady_decode) if concs else None
    for c in concs:  # before any work: every row must run at its full concurrency
        check_pool(engine.pool, c, args.prompt_len + args.max_tokens)
    # Warm-up on the same engine: Triton compilation, CUDA-graph capture (per batch size and
    # block-table width) and allocator growth stay out of the timed runs.
    for c in concs:
        for t in thresholds:
            run_once(engine, mc, args.device, c, t, args.prompt_len, 8)
    rows = [run_once(engine, mc, args.device, c, t, args.prompt_len, args.max_tokens)
            for c in concs for t in thresholds]
    del engine
    prefill = [{"prompt_len": n, "ms": round(prefill_ms(mc, model, dtype, args.device, n), 2)}
               for n in map(int, filter(None, args.prefill_lens.split(",")))]
    floors = None
    if args.floors and args.device.startswith("cuda"):
        import floors as fl

        torch.cuda.empty_cache()
        floors = fl.ceilings(args.device)
        for r in rows:
            ctx = args.prompt_len + args.max_tokens // 2
            roof = fl.decode_roofline(model, mc, r["concurrency"], ctx, floors["copy_gbps"])
            r["roofline_tok_per_s"] = roof["tok_per_s"]
            if r["full_conc_tok_per_s"]:
                r["of_roofline"] = round(r["full_conc_tok_per_s"] / roof["tok_per_s"], 3)
        for p in prefill:
            p["floor_ms"] = round(fl.prefill_floor_ms(model, mc, p["prompt_len"]), 2)
            p["x_floor"] = round(p["ms"] / p["floor_ms"], 3)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("RLT_COMMIT") or commit,
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "model": args.model or f"{args.family}-{args.preset}", "family": mc.family,
            "dtype": str(dtype).replace("torch.", ""), "device": args.device, "prompt_len": args.prompt_len,
            "max_tokens": args.max_tokens, "command": " ".join(sys.argv),
            "attention": "torch reference" if os.environ.get("RLT_TORCH_ATTENTION") == "1" or args.device == "cpu"
            else "triton", "cuda_graph_max_batch": args.cuda_graph_max_batch if args.device != "cpu" else 0,
            "steady_decode": args.steady_decode, "kernels": kernel_choices(args.device),
            "ceilings": floors}
    print(json.dumps(meta))
    print(f"{'conc':>5} {'thr':>5} {'tok/s':>9} {'decode tok/s':>13} {'at full conc':>13} {'its depth':>10} "
          f"{'mean depth':>11} {'total s':>8} {'roofline':>9} {'of roof':>8}")
    for r in rows:
        print(f"{r['concurrency']:>5} {r['threshold']:>5} {r['tok_per_s']:>9} {str(r['decode_tok_per_s']):>13} "
              f"{str(r['full_conc_tok_per_s']):>13} {str(r['full_conc_mean_depth']):>10} "
              f"{str(r['mean_decode_depth']):>11} {r['total_s']:>8} "
              f"{str(r.get('roofline_tok_per_s', '')):>9} {str(r.get('of_roofline', '')):>8}")
    for p in prefill:
        print(f"prefill {p['prompt_len']:>6} tokens: {p['ms']:>9} ms" +
              (f"   dense floor {p['floor_ms']} ms   x{p['x_floor']}" if "floor_ms" in p else ""))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "prefill": prefill}, f, indent=2)


if __name__ == "__main__":
    main()
