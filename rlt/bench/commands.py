"""`rlt bench offline` and `rlt bench serve` (the parsers: rlt/bench/cli.py; the measurements:
rlt/bench/offline.py and rlt/bench/serving.py).

offline: makes (or reuses) a random-weight checkpoint, submits `concurrency` requests at once and
reports output tokens per second over the whole run (prefill included), over the decode phase and
while every request still runs ("at full conc"), with the mean exit depth of decode tokens;
`--prefill-lens` adds prefill latency (one prompt, submission to first token); on CUDA `--floors`
reports each against its floor measured in the same run (rlt/bench/floors.py).

serve: requests arrive as a Poisson process at each rate for --duration seconds, prompts cycling
through --prompt-lens (random token ids after --shared-prefix-len shared ones), greedy, EOS
ignored, exactly --output-len tokens each; `--sweep-rates` then runs those rates in order until
one is past capacity; `--max-concurrency` runs closed loops (`--ramp`: their clients start over
that many seconds). Per rate, a table row and JSON: TTFT, TPOT, ITL and E2EL (mean, median, p95,
p99), output tok/s, req/s and `saturated`. With --base-url it drives any OpenAI-compatible server
(streamed /v1/completions with token-id prompts); --model then only gives the vocabulary (or
--vocab-size).
"""

import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import msgspec

COLUMNS = [
    "load",
    "completed",
    "output_throughput_tok_s",
    "request_throughput_req_s",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p95_ttft_ms",
    "mean_tpot_ms",
    "p95_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "local_prefills",
    "saturated",
]
ENGINE_OPTIONS = (
    "prefill_chunk",
    "max_num_batched_tokens",
    "decode_pass_rows",
    "max_num_seqs",
    "max_local_prefill_length",
    "max_prefill_queue_size",
    "prefill_worker_chunk",
)


def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here
    )
    return git.stdout.strip()


def floats(csv: str) -> list[float]:
    return [float(x) for x in csv.split(",") if x]


def exits(csv: str) -> list:
    """Exit thresholds, e.g. "1.0,0.5,kl:0.3,argmax-stability:2,depth:8": Ouro's gate's (floats),
    Huginn's (criterion, threshold) pairs, and ("depth", k): every token at depth k."""
    out = []
    for x in filter(None, csv.split(",")):
        name, _, v = x.rpartition(":")
        out.append(
            (name, int(v) if name in ("argmax-stability", "depth") else float(v))
            if name
            else float(v)
        )
    return out


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x]


def offline(args) -> None:
    import torch

    from rlt.bench import offline as measure
    from rlt.envs import cache_dir
    from rlt.models.checkpoint import make_checkpoint
    from rlt.workers.counters import WorkerCounters
    from rlt.workers.engine import LoopEngine

    counters = WorkerCounters()  # every engine's here: rows report what compiled while they ran
    if args.device.startswith("cuda"):
        from rlt.workers.counters import count_triton_compiles

        count_triton_compiles(counters)
    path = args.model or os.path.join(cache_dir(), "bench", f"{args.family}-{args.preset}")
    if args.model is None and not os.path.isfile(os.path.join(path, "config.json")):
        # (a --model that is missing fails to load)
        make_checkpoint(args.family, path, preset=args.preset)
    mc, dtype, model = measure.load(path, args.device, args.dtype)
    concs, thresholds = ints(args.concurrency), exits(args.threshold)
    # the speculation options given (the engine's defaults otherwise)
    names = ("speculative_tokens", "speculative_max_streams")
    speculation = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    configs = [  # (prompt length, its engine's config)
        (
            plen,
            measure.engine_config(
                max(concs, default=1),
                plen,
                args.kv_gib or 1.0,
                kv_layout=args.kv_layout,
                cuda_graph_max_batch=args.cuda_graph_max_batch,
                steady_decode=args.steady_decode,
                exit_wait_passes=wait,
                kernels=args.kernels,
                speculative_loops=spec,
                **speculation,
            ),
        )
        for plen in ints(args.prompt_len)
        for wait in ints(args.exit_wait_passes)
        for spec in ints(args.speculative_loops)
    ]
    rows, skipped = [], []
    # one engine per (--prompt-len, --exit-wait-passes) value
    for plen, cfg in configs if concs else ():
        engine = LoopEngine(mc, model, cfg, dtype, args.device, counters)
        fit = [c for c in concs if measure.pool_holds(engine.pool, c, plen + args.max_tokens)]
        skipped += [f"concurrency {c} at a {plen}-token prompt" for c in concs if c not in fit]
        variants = (False, True) if args.penalties else (False,)
        found = measure.decode_rows(engine, mc, fit, thresholds, plen, args.max_tokens, variants)
        rows += [
            r
            | {
                "exit_wait_passes": cfg.exit_wait_passes,
                "prompt_len": plen,
                "spec": cfg.speculative_loops,
            }
            for r in found
        ]
        del engine
        gc.collect()  # (an engine holds reference cycles: its KV pool goes only with them)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    prefill = []
    for n in ints(args.prefill_lens):
        ms = measure.prefill_ms(mc, model, dtype, args.device, n, kernels=args.kernels)
        prefill.append({"prompt_len": n, "ms": round(ms, 2)})
    if skipped:
        print(
            f"not run (the KV pool of {args.kv_gib or 1.0} GiB cannot hold them at once): "
            + ", ".join(skipped)
        )
        if not rows:
            raise SystemExit("no row fits: raise --kv-gib (or lower --concurrency, --prompt-len)")
    ceilings = None
    if args.floors and args.device.startswith("cuda"):
        ceilings = measure.against_floors(rows, prefill, model, mc, args.device, args.max_tokens)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": args.commit or git_commit(),
        **measure.environment(args.device),
        "model": args.model or f"{args.family}-{args.preset}",
        "family": mc.family,
        "dtype": str(dtype).replace("torch.", ""),
        "device": args.device,
        "prompt_lens": args.prompt_len,
        "max_tokens": args.max_tokens,
        "command": " ".join(sys.argv),
        "engine": msgspec.to_builtins(configs[0][1]),
        "ceilings": ceilings,
    }
    print(json.dumps(meta))
    print(
        f"{'conc':>5} {'prompt':>6} {'thr':>5} {'wait':>4} {'pen':>4} {'tok/s':>9} {'decode tok/s':>13} "
        f"{'at full conc':>13} {'its depth':>10} "
        f"{'sd':>6} {'mean depth':>11} {'total s':>8} {'roofline':>9} {'of roof':>8}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>5} {r['prompt_len']:>6} {r['threshold']:>5} {r['exit_wait_passes']:>4} "
            f"{'yes' if r['penalized'] else 'no':>4} {r['tok_per_s']:>9} "
            f"{str(r['decode_tok_per_s']):>13} {str(r['full_conc_tok_per_s']):>13} "
            f"{str(r['full_conc_mean_depth']):>10} {str(r['full_conc_depth_sd']):>6} "
            f"{str(r['mean_decode_depth']):>11} {r['total_s']:>8} "
            f"{str(r.get('roofline_tok_per_s', '')):>9} {str(r.get('of_roofline', '')):>8}"
        )
    for r in rows:
        if r["compiles"] or r["captures"]:
            print(
                f"conc {r['concurrency']} thr {r['threshold']} wait {r['exit_wait_passes']}: {r['compiles']} Triton "
                f"compiles, {r['captures']} CUDA graph captures while measured (the warm-up missed them)"
            )
    for line in _speculation(rows, configs[0][1].speculative_tokens):
        print(line)
    for plain, pen in zip(rows[::2], rows[1::2]) if args.penalties else ():
        keys = ("decode_tok_per_s", "full_conc_tok_per_s")
        ratios = [pen[k] / plain[k] if pen[k] and plain[k] else None for k in keys]
        print(
            f"penalized / unpenalized, conc {plain['concurrency']} thr {plain['threshold']}: decode tok/s "
            + ", at full conc ".join("-" if x is None else f"{x:.3f}" for x in ratios)
        )
    for p in prefill:
        floor = f"   dense floor {p['floor_ms']} ms   x{p['x_floor']}" if "floor_ms" in p else ""
        print(f"prefill {p['prompt_len']:>6} tokens: {p['ms']:>9} ms{floor}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "prefill": prefill}, f, indent=2)


@asynccontextmanager
async def _target(args, options: dict):
    import rlt
    from rlt.bench.serving import EngineTarget, HTTPTarget

    if args.base_url is None:
        async with rlt.Engine.launch(
            args.model, topology=args.topology, device=args.device, dtype=args.dtype, **options
        ) as engine:
            yield EngineTarget(engine)
        return
    vocab = args.vocab_size
    if vocab is None:
        if args.model is None or not os.path.isfile(os.path.join(args.model, "config.json")):
            raise SystemExit(
                "--base-url needs --vocab-size or --model DIR (its config.json's vocab_size)"
            )
        from rlt.models.json_object import read_json_object

        vocab = read_json_object(os.path.join(args.model, "config.json"))["vocab_size"]
    target = HTTPTarget(args.base_url, args.served_model_name, vocab, args.api_key)
    if target.model is None:
        target.model = (await target.client.get_json("/models"))["data"][0]["id"]
    try:
        yield target
    finally:
        target.client.close()


async def _serve(args, meta: dict, options: dict) -> list[dict]:
    """Every row, each printed and (with --json-out) written as soon as it is measured, so a run
    stopped by a time limit keeps the rates it finished."""
    from rlt.bench import vllm_flags
    from rlt.bench.serving import sweep, warm_up

    async with _target(args, options) as target:
        lens = ints(args.prompt_lens)
        await warm_up(target, lens, args.output_len)
        print(json.dumps(meta))
        print(" ".join(f"{c:>14}" for c in COLUMNS), flush=True)

        def report(row, rows):
            load = row["rate"] if "rate" in row else f"{row['concurrency']} at once"
            print(
                " ".join(f"{str(row.get(c, load if c == 'load' else None)):>14}" for c in COLUMNS),
                flush=True,
            )
            if args.vllm:
                print(vllm_flags.summary(row), flush=True)
            if args.json_out:  # replaced whole: a run killed mid-write keeps the previous file
                with open(args.json_out + ".tmp", "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=2)
                os.replace(args.json_out + ".tmp", args.json_out)

        return await sweep(
            target,
            lens,
            args.output_len,
            floats(args.rates),
            args.duration,
            floats(args.sweep_rates),
            args.sweep_duration,
            args.seed,
            on_row=report,
            concurrencies=ints(args.max_concurrency),
            num_requests=args.num_prompts,
            shared_prefix_len=args.shared_prefix_len,
            ramp_s=args.ramp,
            count=args.count,
        )


def _speculation(rows: list[dict], tokens: int) -> list[str]:
    """Each speculating row's acceptance and its tok/s against the same row without speculation."""
    lines = []
    for r in rows:
        key = ("concurrency", "prompt_len", "threshold", "exit_wait_passes", "penalized")
        plain = next((p for p in rows if not p["spec"] and all(p[k] == r[k] for k in key)), None)
        if (
            not r["spec"]
            or plain is None
            or not (r["full_conc_tok_per_s"] and plain["full_conc_tok_per_s"])
        ):
            continue
        x = r["full_conc_tok_per_s"] / plain["full_conc_tok_per_s"]
        lines.append(
            f"speculative_loops {r['spec']}, tokens {tokens}: conc {r['concurrency']} prompt {r['prompt_len']} "
            f"thr {r['threshold']}: acceptance {r['acceptance']}, {r['tokens_per_round']} tokens a round, "
            f"full conc tok/s x{x:.3f} of plain"
        )
    return lines


def serve(args) -> None:
    from rlt import envs
    from rlt.bench import vllm_flags
    from rlt.models.default_model import default_model_path

    args.count = None  # (vLLM's --num-prompts at a --request-rate: apply sets it)
    args.vllm = vllm_flags.apply(args)
    if args.model is None:  # (over HTTP: its vocabulary, unless --vocab-size)
        args.model = default_model_path()
    # the engine's defaults except where an option is given (a long first start is no failure)
    options = dict(kernels=args.kernels, startup_timeout=900.0, heartbeat_timeout=120.0)
    if args.kv_gib is not None:
        options["kv_memory_bytes"] = int(args.kv_gib * 2**30)
    if args.no_prefix_caching:
        options["enable_prefix_caching"] = False
    options |= {
        name: getattr(args, name) for name in ENGINE_OPTIONS if getattr(args, name) is not None
    }
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": args.commit or git_commit(),
        "model": args.model,
        "topology": args.topology if args.base_url is None else None,
        "base_url": args.base_url,
        "device": args.device,
        "prompt_lens": args.prompt_lens,
        "shared_prefix_len": args.shared_prefix_len,
        "output_len": args.output_len,
        "duration_s": args.duration,
        "command": " ".join(sys.argv),
        "pdl": envs.pdl_enabled() if args.device.startswith("cuda") else None,
        "options": options,
    }
    asyncio.run(_serve(args, meta, options))
