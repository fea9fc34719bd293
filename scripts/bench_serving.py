"""Serving benchmark: Poisson arrivals into rlt.Engine, vLLM's metric names.

    python scripts/bench.py --mode serve --model DIR --topology 1p1d --rates 0.25,0.5,1 --duration 60 \\
        --prompt-lens 128,4096 --output-len 64 [--device cuda]

Requests arrive as a Poisson process at each rate for --duration seconds, prompts cycling through
--prompt-lens (random token ids), greedy, EOS ignored, exactly --output-len tokens each. Reported
per rate, as a table and JSON: TTFT, TPOT, ITL and E2EL in ms (mean, median, p95, p99), output
tokens/s and requests/s (completed requests over the time from the first arrival to the last
completion), and whether the rate is past capacity (`saturated`); the JSON also keeps each
request's prompt length, TTFT and TPOT. `--sweep-rates 2,4,6,...` then runs those rates in order
(each for `--sweep-duration` seconds, default `--duration`) and stops after the first one past
capacity: the configuration's capacity lies between it and the rate before. Runs of two
configurations over the same rates compare rate by rate.
scripts/compare_serving.py checks issue #6's P4 on two such JSON files.
"""

import asyncio
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def summarize(name, values_s):
    ms = [v * 1e3 for v in values_s]
    if not ms:
        return {f"mean_{name}_ms": None}
    return {f"mean_{name}_ms": round(statistics.fmean(ms), 2), f"median_{name}_ms": round(statistics.median(ms), 2),
            f"p95_{name}_ms": round(percentile(ms, 95), 2), f"p99_{name}_ms": round(percentile(ms, 99), 2)}


async def one_rate(engine, rate, duration, prompt_lens, output_len, seed):
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        arrivals.append(t)
    sp = rlt.SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    results = []

    async def request(i, at, start):
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_lens[i % len(prompt_lens)])]
        t0 = time.perf_counter()
        stamps, n = [], 0
        async for out in engine.generate(prompt, sp):
            now = time.perf_counter()
            new = len(out.token_ids) - n
            n = len(out.token_ids)
            stamps += [now] * new  # tokens merged into one output arrive together
        results.append({"submit": t0, "stamps": stamps, "tokens": n, "prompt_len": len(prompt)})

    start = time.perf_counter()
    await asyncio.gather(*(request(i, at, start) for i, at in enumerate(arrivals)))
    if not results:
        return {"rate": rate, "completed": 0}
    first = min(r["submit"] for r in results)
    last = max(r["stamps"][-1] for r in results)
    span = max(r["submit"] for r in results) - first
    ttft = [r["stamps"][0] - r["submit"] for r in results]
    e2el = [r["stamps"][-1] - r["submit"] for r in results]
    tpot = [(r["stamps"][-1] - r["stamps"][0]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    itl = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    out_tokens = sum(r["tokens"] for r in results)
    return {"rate": rate, "completed": len(results), "duration_s": round(last - first, 2),
            "output_throughput_tok_s": round(out_tokens / (last - first), 2),
            "request_throughput_req_s": round(len(results) / (last - first), 3),
            # the Poisson draw's own rate (arrivals over their span), which saturation compares against
            "arrival_rate_req_s": round((len(results) - 1) / span, 3) if span > 0 else None,
            **summarize("ttft", ttft), **summarize("tpot", tpot), **summarize("itl", itl), **summarize("e2el", e2el),
            # per request, in arrival order: [prompt tokens, TTFT ms, TPOT ms]
            "requests": [[r["prompt_len"], round((r["stamps"][0] - r["submit"]) * 1e3, 2),
                          round((r["stamps"][-1] - r["stamps"][0]) / max(1, r["tokens"] - 1) * 1e3, 3)]
                         for r in sorted(results, key=lambda r: r["submit"])]}


def saturated(row: dict) -> bool:
    """Past capacity: the engine fell behind its arrivals. Either the run took over 10 % longer than
    an engine keeping up with them would — their own span (a 60 s Poisson draw at 0.5/s may hold 23
    arrivals, not 30) plus one median E2EL for the last request — or a queue grew during the run:
    for some prompt length, the last quarter of its arrivals waited for their first token over twice
    as long as the first quarter, and over 250 ms longer (an engine behind from the start also has
    a long median E2EL, which the first test forgives). Per length, since a long prompt's first
    token takes longer anyway and the quarters need not hold the same mix."""
    if row.get("completed", 0) < 2 or not row.get("arrival_rate_req_s"):
        return True
    span = (row["completed"] - 1) / row["arrival_rate_req_s"]
    took = row["completed"] / row["request_throughput_req_s"]
    if took > (span + row.get("median_e2el_ms", 0.0) / 1e3) / 0.9:
        return True
    by_len = {}
    for n, ttft, _ in row.get("requests", []):  # in arrival order
        by_len.setdefault(n, []).append(ttft)
    for ttfts in by_len.values():
        q = len(ttfts) // 4
        if q:
            early, late = statistics.median(ttfts[:q]), statistics.median(ttfts[-q:])
            if late > 2 * early and late - early > 250:
                return True
    return False


async def warm_up(engine, prompt_lens, output_len, burst=16):
    """Before timing (as vLLM's serving benchmark sends a test request first, and vLLM captures its
    CUDA graphs at startup): each prompt length alone, two of each at once, then a burst of `burst`,
    so kernel compilation and the CUDA-graph captures of the batch sizes the rates decode at (1, 2,
    ... 16) stay out of the measured rates."""
    sp = rlt.SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)

    async def one(n):
        async for _ in engine.generate([3 + i % 97 for i in range(n)], sp):
            pass

    for n in prompt_lens:
        await one(n)
    await asyncio.gather(*(one(n) for n in prompt_lens for _ in range(2)))
    await asyncio.gather(*(one(prompt_lens[i % len(prompt_lens)]) for i in range(burst)))


COLUMNS = ["rate", "completed", "output_throughput_tok_s", "request_throughput_req_s", "mean_ttft_ms", "p95_ttft_ms",
           "mean_tpot_ms", "p95_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "local_prefills", "saturated"]


async def serve(args, meta: dict) -> list[dict]:
    """Every rate's row, each printed and (with --json-out) written as soon as it is measured, so a
    run stopped by a time limit keeps the rates it finished."""
    opts = dict(kv_memory_bytes=int(args.kv_gib * 2**30), prefill_chunk=args.prefill_chunk,
                max_num_seqs=args.max_num_seqs, startup_timeout=900.0, heartbeat_timeout=120.0)
    for name in ("max_local_prefill_length", "max_prefill_queue_size", "prefill_worker_chunk"):
        if getattr(args, name) is not None:
            opts[name] = getattr(args, name)
    async with rlt.Engine.launch(args.model, topology=args.topology, device=args.device, dtype=args.dtype,
                                 **opts) as engine:
        lens = list(map(int, args.prompt_lens.split(",")))
        await warm_up(engine, lens, args.output_len)
        rows = []
        print(json.dumps(meta))
        print(" ".join(f"{c:>14}" for c in COLUMNS), flush=True)

        async def run(rate, duration):
            before = engine.stats()["local_prefills"]
            row = await one_rate(engine, rate, duration, lens, args.output_len, args.seed)
            row["arrivals_s"] = duration
            row["local_prefills"] = engine.stats()["local_prefills"] - before  # PD: prefilled by a decode worker
            row["saturated"] = saturated(row)
            rows.append(row)
            print(" ".join(f"{str(row.get(c)):>14}" for c in COLUMNS), flush=True)
            if args.json_out:  # replaced whole: a run killed mid-write keeps the previous file
                with open(args.json_out + ".tmp", "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=2)
                os.replace(args.json_out + ".tmp", args.json_out)

        for rate in args.rates.split(","):
            await run(float(rate), args.duration)
        for rate in filter(None, args.sweep_rates.split(",")):
            if rows[-1]["saturated"]:
                break  # this configuration's capacity lies below the last rate
            if float(rate) > rows[-1]["rate"]:
                await run(float(rate), args.sweep_duration or args.duration)
        return rows


def main(args):
    meta = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("RLT_COMMIT", ""), "model": args.model,
            "topology": args.topology, "device": args.device, "prompt_lens": args.prompt_lens,
            "output_len": args.output_len, "duration_s": args.duration, "command": " ".join(sys.argv),
            "max_local_prefill_length": args.max_local_prefill_length,
            "max_prefill_queue_size": args.max_prefill_queue_size, "prefill_worker_chunk": args.prefill_worker_chunk}
    return asyncio.run(serve(args, meta))
