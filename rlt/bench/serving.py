"""The serving benchmark: Poisson arrivals into rlt.Engine, vLLM's metric names.

Requests arrive as a Poisson process at each rate for `duration` seconds, prompts cycling through
`prompt_lens` (random token ids), greedy, EOS ignored, exactly `output_len` tokens each. Per rate:
TTFT, TPOT, ITL and E2EL in ms (mean, median, p95, p99), output tokens/s and requests/s (completed
requests over the time from the first arrival to the last completion), whether the rate is past
capacity (`saturated`) and each request's prompt length, TTFT and TPOT. Sweep rates then run in
order and stop after the first one past capacity: the configuration's capacity lies between it and
the rate before.
"""

import asyncio
import random
import statistics
import time
from collections.abc import Callable

from rlt.sampling_params import SamplingParams


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def summarize(name, values_s):
    ms = [v * 1e3 for v in values_s]
    if not ms:
        return {f"mean_{name}_ms": None}
    return {
        f"mean_{name}_ms": round(statistics.fmean(ms), 2),
        f"median_{name}_ms": round(statistics.median(ms), 2),
        f"p95_{name}_ms": round(percentile(ms, 95), 2),
        f"p99_{name}_ms": round(percentile(ms, 99), 2),
    }


async def one_rate(engine, rate, duration, prompt_lens, output_len, seed):
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        arrivals.append(t)
    sp = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
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
    return {
        "rate": rate,
        "completed": len(results),
        "duration_s": round(last - first, 2),
        "output_throughput_tok_s": round(out_tokens / (last - first), 2),
        "request_throughput_req_s": round(len(results) / (last - first), 3),
        # the Poisson draw's own rate (arrivals over their span), which saturation compares against
        "arrival_rate_req_s": round((len(results) - 1) / span, 3) if span > 0 else None,
        **summarize("ttft", ttft),
        **summarize("tpot", tpot),
        **summarize("itl", itl),
        **summarize("e2el", e2el),
        # per request, in arrival order: [prompt tokens, TTFT ms, TPOT ms]
        "requests": [
            [
                r["prompt_len"],
                round((r["stamps"][0] - r["submit"]) * 1e3, 2),
                round((r["stamps"][-1] - r["stamps"][0]) / max(1, r["tokens"] - 1) * 1e3, 3),
            ]
            for r in sorted(results, key=lambda r: r["submit"])
        ],
    }


def saturated(row: dict) -> bool:
    """Past capacity (a heuristic; it ends a sweep): the engine fell behind its arrivals. Either
    the run took over 10 % longer than an engine keeping up with them would — their own span (a 60 s
    Poisson draw at 0.5/s may hold 23 arrivals, not 30) plus one median E2EL for the last request —
    or a queue grew during the run: for some prompt length, the last quarter of its arrivals waited
    for their first token over twice as long as the first quarter, and over 250 ms longer (an
    engine behind from the start also has a long median E2EL, which the first test forgives). Per
    length, since a long prompt's first token takes longer anyway and the quarters need not hold
    the same mix."""
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
    sp = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)

    async def one(n):
        async for _ in engine.generate([3 + i % 97 for i in range(n)], sp):
            pass

    for n in prompt_lens:
        await one(n)
    await asyncio.gather(*(one(n) for n in prompt_lens for _ in range(2)))
    await asyncio.gather(*(one(prompt_lens[i % len(prompt_lens)]) for i in range(burst)))


async def sweep(
    engine,
    prompt_lens: list[int],
    output_len: int,
    rates: list[float],
    duration: float,
    sweep_rates: list[float] = (),
    sweep_duration: float | None = None,
    seed: int = 0,
    on_row: Callable[[dict, list[dict]], None] | None = None,
) -> list[dict]:
    """A row per rate of `rates` (after warm_up), then `sweep_rates` in order (each for
    `sweep_duration` seconds, default `duration`) until one is past capacity. `on_row(row, rows)`
    sees every row as soon as it is measured (so a caller stopped by a time limit keeps the rates
    it finished). Each row also counts the prompts a PD decode worker prefilled itself."""
    rows = []

    async def run(rate, seconds):
        before = engine.stats()["local_prefills"]
        row = await one_rate(engine, rate, seconds, prompt_lens, output_len, seed)
        row["arrivals_s"] = seconds
        row["local_prefills"] = engine.stats()["local_prefills"] - before  # PD: prefilled by a decode worker
        row["saturated"] = saturated(row)
        rows.append(row)
        if on_row is not None:
            on_row(row, rows)

    for rate in rates:
        await run(rate, duration)
    for rate in sweep_rates:
        if rows and rows[-1]["saturated"]:
            break  # this configuration's capacity lies below the last rate
        if not rows or rate > rows[-1]["rate"]:
            await run(rate, sweep_duration or duration)
    return rows
