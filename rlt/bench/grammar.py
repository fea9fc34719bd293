"""`rlt bench grammar`: what structured output costs, through rlt.Engine with default options (the
parser: rlt/bench/cli.py).

1. decode: `--streams` concurrent requests constrained by a 6-field JSON schema against the same
   requests unconstrained (EOS ignored); output tok/s while every stream is running.
2. TTFT: one request at a time, a cached schema against none, interleaved; the medians.
3. a new schema's compile: `--neighbours` unconstrained streams decoding while requests with a new
   schema each arrive every `--arrival-ms`, against the same arrivals unconstrained; the
   neighbours' inter-token latency (p50, p99).

Random prompts and random weights: the schema's long strings and fixed-length array keep the
constrained outputs long (the grammar, not the weights, decides their length).
"""

import asyncio
import json
import random
import statistics
import time

import msgspec

import rlt
from rlt import SamplingParams, StructuredOutput


def random_prompt(rng, vocab: int, n: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def schema(tag: str = "") -> dict:
    """Six fields (a new `tag` renames them: a schema no cache has seen)."""
    props = {
        "name": {"type": "string", "minLength": 24, "maxLength": 48},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{8,16}@[a-z]{4,8}\\.com$"},
        "tags": {
            "type": "array",
            "items": {"type": "integer", "minimum": 100, "maximum": 999},
            "minItems": 24,
            "maxItems": 24,
        },
        "active": {"type": "boolean"},
        "note": {"type": "string", "minLength": 64, "maxLength": 96},
    }
    props = {f"{k}{tag}": v for k, v in props.items()}
    closed = {"additionalProperties": False}
    return {"type": "object", "properties": props, "required": list(props)} | closed


def params(max_tokens: int, so: dict | None, seed: int) -> SamplingParams:
    structured = StructuredOutput(json=so) if so is not None else None
    sp = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=so is None)
    return msgspec.structs.replace(sp, structured_output=structured)


async def stream(engine, prompt, sp, log: list) -> None:
    """Append (time, tokens so far) per output."""
    async for out in engine.generate(prompt, sp):
        log.append((time.perf_counter(), len(out.token_ids)))


def inside(log: list, start: float, end: float) -> int:
    """A stream's tokens between `start` and `end`, from its (time, tokens so far) log."""
    return next(n for t, n in reversed(log) if t <= end) - next(n for t, n in log if t >= start)


def per_token_ms(log: list) -> list[float]:
    return [(b[0] - a[0]) * 1e3 / (b[1] - a[1]) for a, b in zip(log, log[1:]) if b[1] > a[1]]


async def decode(engine, prompts, max_tokens: int, so) -> dict:
    logs = [[] for _ in prompts]
    sps = [params(max_tokens, so, seed) for seed in range(len(prompts))]
    await asyncio.gather(*(stream(engine, p, sp, log) for p, sp, log in zip(prompts, sps, logs)))
    start = max(lg[0][0] for lg in logs)  # every stream has its first token
    end = min(lg[-1][0] for lg in logs)  # the first stream ends
    tokens = sum(inside(lg, start, end) for lg in logs)
    lengths = [lg[-1][1] for lg in logs]
    return {
        "tok_per_s": round(tokens / (end - start), 1),
        "window_s": round(end - start, 3),
        "mean_len": statistics.mean(lengths),
    }


async def ttft(engine, prompt, so, seed: int) -> float:
    t0 = time.perf_counter()
    async for _ in engine.generate(prompt, params(1, so, seed)):
        return (time.perf_counter() - t0) * 1e3


async def compile_stall(engine, rng, vocab, args, new_schemas: bool) -> dict:
    """Neighbours' inter-token latencies while requests arrive (each with a schema never seen)."""
    prompts = [random_prompt(rng, vocab, args.prompt_len) for _ in range(args.neighbours)]
    logs = [[] for _ in prompts]
    tasks = [
        asyncio.create_task(stream(engine, p, params(args.max_tokens, None, i), lg))
        for i, (p, lg) in enumerate(zip(prompts, logs))
    ]
    while not all(logs):
        await asyncio.sleep(0.005)
    arrivals, tag = [], 0
    # (at least one arrival: on a busy machine a neighbour may finish before all have begun)
    while not tag or not any(t.done() for t in tasks):
        tag += 1
        so = schema(f"_{rng.randrange(1 << 30)}") if new_schemas else None
        prompt = [rng.randrange(3, vocab) for _ in range(64)]
        arrivals.append(asyncio.create_task(stream(engine, prompt, params(16, so, tag), [])))
        await asyncio.sleep(args.arrival_ms / 1e3)
    await asyncio.gather(*tasks, *arrivals)
    # ms per token between outputs after each stream's second (its first gap waits on the prefill)
    gaps = sorted(itl for lg in logs for itl in per_token_ms(lg[1:]))
    q = lambda f: round(gaps[min(len(gaps) - 1, int(f * len(gaps)))], 2)  # noqa: E731
    return {
        "new_schemas": new_schemas,
        "arrivals": tag,
        "itl_p50_ms": q(0.5),
        "itl_p99_ms": q(0.99),
        "itl_max_ms": round(gaps[-1], 2),
    }


async def _grammar(args) -> dict:
    result = {"streams": args.streams}
    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900) as engine:
        rng, vocab = random.Random(0), engine.model_config.vocab_size
        prompts = [random_prompt(rng, vocab, args.prompt_len) for _ in range(args.streams)]
        # warm: the schema compiled and cached, every path run
        await decode(engine, prompts[:4], 8, schema())
        for rep in range(args.repeat):
            for so in (None, schema()):
                row = await decode(engine, prompts, args.max_tokens, so)
                result.setdefault("constrained" if so else "free", []).append(row)
                print("decode", "constrained" if so else "free", rep, row, flush=True)
        free = statistics.mean(r["tok_per_s"] for r in result["free"])
        constrained = statistics.mean(r["tok_per_s"] for r in result["constrained"])
        result["decode_ratio"] = round(constrained / free, 3)
        short = [rng.randrange(3, vocab) for _ in range(128)]
        t = {"free": [], "cached": []}
        for i in range(args.ttft_reps):
            t["free"].append(await ttft(engine, short, None, i))
            t["cached"].append(await ttft(engine, short, schema(), i))
        result["ttft_ms"] = {k: round(statistics.median(v), 3) for k, v in t.items()}
        result["ttft_added_ms"] = round(result["ttft_ms"]["cached"] - result["ttft_ms"]["free"], 3)
        print("ttft", result["ttft_ms"], "added", result["ttft_added_ms"], flush=True)
        result["compile_stall"] = []
        for rep in range(args.repeat):
            for new in (False, True):
                row = await compile_stall(engine, rng, vocab, args, new)
                result["compile_stall"].append(row)
                print("neighbours", row, flush=True)
    return result


def grammar(args) -> None:
    res = asyncio.run(_grammar(args))
    print(json.dumps(res))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)
