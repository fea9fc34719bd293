"""Serving benchmark, the CLI of `scripts/bench.py --mode serve` (the measurement: rlt/bench/serving.py).

    python scripts/bench.py --mode serve --model DIR --topology 1p1d --rates 0.25,0.5,1 --duration 60 \\
        --prompt-lens 128,4096 --output-len 64 [--device cuda]
    python scripts/bench.py --mode serve --base-url http://127.0.0.1:8000/v1 --model DIR --rates 1,4

Without --base-url it launches rlt.Engine in this process (the options below); with it, it drives
any OpenAI-compatible server (`rlt serve`, `vllm serve`, SGLang) over HTTP with the same workload
and metrics, streamed /v1/completions with token-id prompts (`ignore_eos`, `return_token_ids`):
--model then only names the checkpoint whose config.json gives the vocabulary the random prompts
are drawn from (or --vocab-size), and the served model is the server's first (or
--served-model-name).

Requests arrive as a Poisson process at each rate for --duration seconds, prompts cycling through
--prompt-lens (random token ids, after --shared-prefix-len tokens every prompt shares), greedy, EOS
ignored, exactly --output-len tokens each. Reported per rate, as a table and JSON: TTFT, TPOT, ITL
and E2EL in ms (mean, median, p95, p99), output tokens/s and requests/s (completed requests over
the time from the first arrival to the last completion), and whether the rate is past capacity
(`saturated`); the JSON also keeps each request's prompt length, TTFT and TPOT. `--sweep-rates
2,4,6,...` then runs those rates in order (each for `--sweep-duration` seconds, default
`--duration`) and stops after the first one past capacity: the configuration's capacity lies
between it and the rate before. `--max-concurrency 1,64` then runs closed loops (--num-prompts
requests, that many in flight; vLLM's option of that name). Runs of two configurations over the
same rates compare rate by rate (scripts/compare_serving.py). `--no-prefix-caching` turns the
prefix cache off (A/B against the default).
"""

import asyncio
import json
import os
import sys
import time
from contextlib import asynccontextmanager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402
from rlt import envs  # noqa: E402
from rlt.bench.serving import EngineTarget, HTTPTarget, sweep, warm_up  # noqa: E402

COLUMNS = [
    "load",
    "completed",
    "output_throughput_tok_s",
    "request_throughput_req_s",
    "mean_ttft_ms",
    "p95_ttft_ms",
    "mean_tpot_ms",
    "p95_tpot_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "local_prefills",
    "saturated",
]
PD_OPTIONS = ("max_local_prefill_length", "max_prefill_queue_size", "prefill_worker_chunk")


def add_arguments(group) -> None:
    """The serve-mode options (bench.py adds --model, --device, --dtype, --kv-gib, --kernels,
    --commit and --json-out). Engine options left out keep the engine's defaults."""
    group.add_argument("--base-url", help="an OpenAI-compatible server's /v1 URL (default: rlt.Engine in process)")
    group.add_argument("--served-model-name", help="HTTP: the model name to send (default: the server's first)")
    group.add_argument("--api-key", help="HTTP: sent as `Authorization: Bearer KEY`")
    group.add_argument("--vocab-size", type=int, help="HTTP: prompt token ids lie below it (default: --model's)")
    group.add_argument("--max-concurrency", default="", help="e.g. 1,64: closed loops after the rates")
    group.add_argument("--num-prompts", type=int, help="requests per closed loop (default: 4 per slot, at least 16)")
    group.add_argument("--topology", default="single")
    group.add_argument("--rates", default="0.25,0.5,1")
    group.add_argument("--duration", type=float, default=60.0)
    group.add_argument("--prompt-lens", default="128,4096")
    group.add_argument("--output-len", type=int, default=64)
    group.add_argument("--shared-prefix-len", type=int, default=0, help="tokens every prompt starts with")
    group.add_argument("--no-prefix-caching", action="store_true", help="enable_prefix_caching=False")
    group.add_argument("--prefill-chunk", type=int, help="(default: the engine's)")
    group.add_argument("--max-num-batched-tokens", type=int, help="(default: the engine's)")
    group.add_argument("--max-num-seqs", type=int, help="(default: the engine's)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--sweep-rates", default="", help="e.g. 2,4,6,8: after --rates, these in order until one is past capacity"
    )
    group.add_argument("--sweep-duration", type=float, help="seconds of arrivals per sweep rate (default --duration)")
    group.add_argument("--max-local-prefill-length", type=int, help="PD: conditional disaggregation (README)")
    group.add_argument("--max-prefill-queue-size", type=int, help="PD: conditional disaggregation (README)")
    group.add_argument("--prefill-worker-chunk", type=int, help="PD: prompt rows per chunk on prefill workers (README)")


def floats(csv: str) -> list[float]:
    return [float(x) for x in csv.split(",") if x]


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x]


@asynccontextmanager
async def target_of(args, options: dict):
    if args.base_url is None:
        async with rlt.Engine.launch(
            args.model, topology=args.topology, device=args.device, dtype=args.dtype, **options
        ) as engine:
            yield EngineTarget(engine)
        return
    vocab = args.vocab_size
    if vocab is None:
        if args.model is None or not os.path.isfile(os.path.join(args.model, "config.json")):
            raise SystemExit("--base-url needs --vocab-size or --model DIR (its config.json's vocab_size)")
        from rlt.config import read_json_object

        vocab = read_json_object(os.path.join(args.model, "config.json"))["vocab_size"]
    target = HTTPTarget(args.base_url, args.served_model_name, vocab, args.api_key)
    if target.model is None:
        target.model = (await target.client.get_json("/models"))["data"][0]["id"]
    try:
        yield target
    finally:
        target.client.close()


async def serve(args, meta: dict, options: dict) -> list[dict]:
    """Every row, each printed and (with --json-out) written as soon as it is measured, so a run
    stopped by a time limit keeps the rates it finished."""
    async with target_of(args, options) as target:
        lens = ints(args.prompt_lens)
        await warm_up(target, lens, args.output_len)
        print(json.dumps(meta))
        print(" ".join(f"{c:>14}" for c in COLUMNS), flush=True)

        def report(row, rows):
            load = row["rate"] if "rate" in row else f"{row['concurrency']} at once"
            print(" ".join(f"{str(row.get(c, load if c == 'load' else None)):>14}" for c in COLUMNS), flush=True)
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
        )


def main(args):
    # the engine's defaults except where an option is given (a long first start is no failure)
    options = dict(kernels=args.kernels, startup_timeout=900.0, heartbeat_timeout=120.0)
    if args.kv_gib is not None:
        options["kv_memory_bytes"] = int(args.kv_gib * 2**30)
    if args.no_prefix_caching:
        options["enable_prefix_caching"] = False
    for name in ("prefill_chunk", "max_num_batched_tokens", "max_num_seqs", *PD_OPTIONS):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": args.commit,
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
    return asyncio.run(serve(args, meta, options))
