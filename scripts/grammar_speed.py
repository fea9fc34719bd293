"""What structured output costs, through rlt.Engine with default options (issue #32's speed items):

1. decode: `--streams` concurrent requests constrained by a 6-field JSON schema against the same
   requests unconstrained (EOS ignored); output tok/s while every stream is running.
2. TTFT: one request at a time, a cached schema against none, interleaved; the medians.
3. a new schema's compile: `--neighbours` unconstrained streams decoding while requests with a new
   schema each arrive every `--arrival-ms`, against the same arrivals unconstrained; the
   neighbours' inter-token latency (p50, p99).

    python scripts/grammar_speed.py --model /tmp/ouro-full --device cuda [--json-out F]

Random prompts and random weights: the schema's long strings and fixed-length array keep the
constrained outputs long (the grammar, not the weights, decides their length).
"""

import argparse
import asyncio
import json
import random
import statistics
import time

import rlt
from rlt import SamplingParams, StructuredOutput


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
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def params(max_tokens: int, so: dict | None, seed: int) -> SamplingParams:
    structured = StructuredOutput(json=so) if so is not None else None
    return SamplingParams(
        max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=so is None, structured_output=structured
    )


async def stream(engine, prompt, sp, log: list) -> None:
    """Append (time, tokens so far) per output."""
    async for out in engine.generate(prompt, sp):
        log.append((time.perf_counter(), len(out.token_ids)))


async def decode(engine, prompts, max_tokens: int, so) -> dict:
    logs = [[] for _ in prompts]
    await asyncio.gather(
        *(stream(engine, p, params(max_tokens, so, i), lg) for i, (p, lg) in enumerate(zip(prompts, logs)))
    )
    start = max(lg[0][0] for lg in logs)  # every stream has its first token
    end = min(lg[-1][0] for lg in logs)  # the first stream ends
    tokens = sum(next(n for t, n in reversed(lg) if t <= end) - next(n for t, n in lg if t >= start) for lg in logs)
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
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.neighbours)]
    logs = [[] for _ in prompts]
    tasks = [
        asyncio.create_task(stream(engine, p, params(args.max_tokens, None, i), lg))
        for i, (p, lg) in enumerate(zip(prompts, logs))
    ]
    while not all(logs):
        await asyncio.sleep(0.005)
    arrivals, tag = [], 0
    while not any(t.done() for t in tasks):
        tag += 1
        so = schema(f"_{rng.randrange(1 << 30)}") if new_schemas else None
        prompt = [rng.randrange(3, vocab) for _ in range(64)]
        arrivals.append(asyncio.create_task(stream(engine, prompt, params(16, so, tag), [])))
        await asyncio.sleep(args.arrival_ms / 1e3)
    await asyncio.gather(*tasks, *arrivals)
    gaps = sorted(
        (b[0] - a[0]) * 1e3 / max(1, b[1] - a[1]) for lg in logs for a, b in zip(lg[1:], lg[2:]) if b[1] > a[1]
    )
    q = lambda f: round(gaps[min(len(gaps) - 1, int(f * len(gaps)))], 2)  # noqa: E731
    return {
        "new_schemas": new_schemas,
        "arrivals": tag,
        "itl_p50_ms": q(0.5),
        "itl_p99_ms": q(0.99),
        "itl_max_ms": round(gaps[-1], 2),
    }


async def main(args) -> dict:
    result = {"streams": args.streams}
    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900) as engine:
        rng, vocab = random.Random(0), engine.model_config.vocab_size
        prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.streams)]
        await decode(engine, prompts[:4], 8, schema())  # warm: the schema compiled and cached, every path run
        for rep in range(args.repeat):
            for so in (None, schema()):
                row = await decode(engine, prompts, args.max_tokens, so)
                result.setdefault("constrained" if so else "free", []).append(row)
                print("decode", "constrained" if so else "free", rep, row, flush=True)
        free = statistics.mean(r["tok_per_s"] for r in result["free"])
        result["decode_ratio"] = round(statistics.mean(r["tok_per_s"] for r in result["constrained"]) / free, 3)
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--neighbours", type=int, default=32)
    ap.add_argument("--arrival-ms", type=float, default=50.0)
    ap.add_argument("--ttft-reps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    res = asyncio.run(main(a))
    print(json.dumps(res))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
