"""The serving benchmark: Poisson arrivals (or a fixed number in flight) into rlt.Engine in this
process or into any OpenAI-compatible server over HTTP, with vLLM's metric names.

Requests arrive as a Poisson process at each rate for `duration` seconds, prompts cycling through
`prompt_lens` (random token ids), greedy, EOS ignored, exactly `output_len` tokens each. Per rate:
TTFT, TPOT, ITL and E2EL in ms (mean, median, p95, p99), output tokens/s and requests/s (completed
requests over the time from the first arrival to the last completion), whether the rate is past
capacity (`saturated`) and each request's prompt length, TTFT and TPOT. Sweep rates then run in
order and stop after the first one past capacity: the configuration's capacity lies between it and
the rate before. A closed loop instead keeps `concurrency` requests in flight until `num_requests`
have run (vLLM's `--max-concurrency`). With a shared prefix every prompt starts with the same
random tokens (a system prompt, as SGLang's generated-shared-prefix workload), then its own
`prompt_lens` tokens.
"""

import asyncio
import itertools
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable

from rlt.bench.http_client import Client
from rlt.contract.sampling_params import SamplingParams


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


class EngineTarget:
    """Requests into an rlt.Engine in this process (its public streaming API)."""

    def __init__(self, engine):
        self.engine, self.vocab_size = engine, engine.model_config.vocab_size

    async def stream(self, prompt: list[int], output_len: int) -> AsyncIterator[int]:
        """The number of tokens received so far, at each arrival."""
        sp = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        async for out in self.engine.generate(prompt, sp):
            yield len(out.token_ids)

    def local_prefills(self) -> int:
        return self.engine.stats().local_prefills


class HTTPTarget:
    """Requests to any OpenAI-compatible server's /v1/completions, streamed (token-id prompts,
    greedy, `ignore_eos` and `return_token_ids` as vLLM's server takes them). A chunk counts its
    `token_ids`; from a server that sends none, a chunk with text counts as one token (as vLLM's
    benchmark counts) and the final `usage` corrects the total."""

    def __init__(
        self, base_url: str, model: str | None, vocab_size: int, api_key: str | None = None
    ):
        self.client, self.model, self.vocab_size = Client(base_url, api_key), model, vocab_size

    async def stream(self, prompt: list[int], output_len: int) -> AsyncIterator[int]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        n = 0
        async for event in self.client.post_events("/completions", body):
            for choice in event.get("choices") or ():
                ids = choice.get("token_ids")
                new = len(ids) if ids is not None else int(bool(choice.get("text")))
                if new:
                    n += new
                    yield n
            usage = event.get("usage")
            # tokens no chunk counted arrive with the last
            if usage and usage.get("completion_tokens", n) > n:
                n = usage["completion_tokens"]
                yield n

    def local_prefills(self) -> None:
        return None


async def _request(target, prompt: list[int], output_len: int) -> dict:
    t0 = time.perf_counter()
    stamps, n = [], 0
    async for count in target.stream(prompt, output_len):
        now = time.perf_counter()
        stamps += [now] * (count - n)  # tokens merged into one output arrive together
        n = count
    return {"submit": t0, "stamps": stamps, "tokens": n, "prompt_len": len(prompt)}


def _prompt(rng, target, length: int, prefix: list[int] = ()) -> list[int]:
    return list(prefix) + [rng.randrange(3, target.vocab_size) for _ in range(length)]


async def one_rate(target, rate, duration, prompt_lens, output_len, seed, prefix=(), count=None):
    """Poisson arrivals at `rate` for `duration` seconds, or `count` of them (vLLM's --num-prompts)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while len(arrivals) < (count or math.inf):
        t += rng.expovariate(rate)
        if count is None and t > duration:
            break
        arrivals.append(t)
    results = []

    async def request(i, at, start):
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        prompt = _prompt(rng, target, prompt_lens[i % len(prompt_lens)], prefix)
        results.append(await _request(target, prompt, output_len))

    start = time.perf_counter()
    await asyncio.gather(*(request(i, at, start) for i, at in enumerate(arrivals)))
    return {"rate": rate, **measure(results)}


async def closed_loop(
    target, concurrency, num_requests, prompt_lens, output_len, seed, prefix=(), ramp_s: float = 0.0
) -> dict:
    """`num_requests` requests, `concurrency` in flight at every moment (a new one as soon as one
    ends; vLLM's `--max-concurrency` with an infinite rate). ramp_s: the clients start evenly over
    this many seconds, client k with request k after k * ramp_s / concurrency, then each takes the
    next one left (0: all at once; in process they then all reach the worker before its next pass,
    over HTTP they cannot)."""
    rng = random.Random(seed)
    prompts = [
        _prompt(rng, target, prompt_lens[i % len(prompt_lens)], prefix) for i in range(num_requests)
    ]
    queue = iter(prompts[concurrency:])
    results = []

    async def client(k):
        await asyncio.sleep(k * ramp_s / concurrency)
        for prompt in itertools.chain(prompts[k : k + 1], queue):
            results.append(await _request(target, prompt, output_len))

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return {"concurrency": concurrency, "ramp_s": ramp_s, **measure(results)}


def measure(results: list[dict]) -> dict:
    """vLLM's serving metrics over these requests (each: submit time, token arrival stamps)."""
    if not results:
        return {"completed": 0}
    first = min(r["submit"] for r in results)
    last = max(r["stamps"][-1] for r in results)
    span = max(r["submit"] for r in results) - first
    ttft = [r["stamps"][0] - r["submit"] for r in results]
    e2el = [r["stamps"][-1] - r["submit"] for r in results]
    tpot = [
        (r["stamps"][-1] - r["stamps"][0]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1
    ]
    itl = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    out_tokens = sum(r["tokens"] for r in results)
    return {
        "completed": len(results),
        "total_input_tokens": sum(r["prompt_len"] for r in results),
        "total_output_tokens": out_tokens,
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


async def warm_up(target, prompt_lens, output_len, burst=16):
    """Before timing (as vLLM's serving benchmark sends a test request first): each prompt length
    alone, two of each at once, then a burst of `burst` (a server's first connections, the
    benchmark's own first passes through its code)."""
    rng = random.Random(-1)

    async def one(n):
        await _request(target, _prompt(rng, target, n), output_len)

    for n in prompt_lens:
        await one(n)
    await asyncio.gather(*(one(n) for n in prompt_lens for _ in range(2)))
    await asyncio.gather(*(one(prompt_lens[i % len(prompt_lens)]) for i in range(burst)))


async def sweep(
    target,
    prompt_lens: list[int],
    output_len: int,
    rates: list[float],
    duration: float,
    sweep_rates: list[float] = (),
    sweep_duration: float | None = None,
    seed: int = 0,
    on_row: Callable[[dict, list[dict]], None] | None = None,
    concurrencies: list[int] = (),
    num_requests: int | None = None,
    shared_prefix_len: int = 0,
    ramp_s: float = 0.0,
    count: int | None = None,
) -> list[dict]:
    """A row per rate of `rates`, then `sweep_rates` in order (each for `sweep_duration` seconds,
    default `duration`) until one is past capacity, then a row per concurrency of `concurrencies`
    (closed loop, `num_requests` requests each, default 4 per slot and at least 16).
    `on_row(row, rows)` sees every row as soon as it is measured (so a caller stopped by a time
    limit keeps the rates it finished). In process, each row also counts the prompts a PD decode
    worker prefilled itself. `shared_prefix_len`: tokens every prompt starts with; `ramp_s`: the
    closed loops' clients start over this many seconds; `count`: each rate sends this many
    requests instead of `duration` seconds of them."""
    rows = []
    prefix = _prompt(random.Random(seed - 1), target, shared_prefix_len)

    async def run(measured, finish=lambda row: None):
        before = target.local_prefills()
        row = await measured
        finish(row)
        if before is not None:  # PD: prefilled by a decode worker
            row["local_prefills"] = target.local_prefills() - before
        rows.append(row)
        if on_row is not None:
            on_row(row, rows)

    async def at_rate(rate, seconds):
        def finish(row):
            row["arrivals_s"], row["saturated"] = seconds, saturated(row)

        await run(
            one_rate(target, rate, seconds, prompt_lens, output_len, seed, prefix, count), finish
        )

    for rate in rates:
        await at_rate(rate, duration)
    for rate in sweep_rates:
        if rows and rows[-1]["saturated"]:
            break  # this configuration's capacity lies below the last rate
        if not rows or rate > rows[-1]["rate"]:
            await at_rate(rate, sweep_duration or duration)
    for c in concurrencies:
        n = num_requests or max(16, 4 * c)
        await run(closed_loop(target, c, n, prompt_lens, output_len, seed, prefix, ramp_s))
    return rows
