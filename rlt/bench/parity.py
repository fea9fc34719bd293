"""Does a PD topology (e.g. 1p1d) produce exactly what single produces? Greedy prompts served by
each topology twice: one at a time (so both see the same batch shapes) and all at once; per mode,
how many requests match token for token and exit depth for exit depth, and the first divergence
of any that do not. `rlt bench parity` runs it (the parser: rlt/bench/cli.py).
"""

import asyncio
import json
import random
import sys
import time

import msgspec

import rlt
from rlt.contract.sampling_params import SamplingParams


async def serve(
    model: str, topology: str, prompts: list[list[int]], sp: SamplingParams, **launch
) -> dict:
    """Every prompt's (token ids, exit depths), sequentially and concurrently, with timings."""
    t0 = time.perf_counter()
    async with rlt.Engine.launch(model, topology=topology, **launch) as engine:
        ready = time.perf_counter() - t0

        async def one(i, p):
            async for out in engine.generate(p, sp, request_id=f"{topology}-{i}"):
                pass
            return out.token_ids, out.exit_depths

        t1 = time.perf_counter()
        seq = [await one(i, p) for i, p in enumerate(prompts)]
        t2 = time.perf_counter()
        conc = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        t3 = time.perf_counter()
        return {
            "sequential": seq,
            "concurrent": list(conc),
            "ready_s": ready,
            "sequential_s": t2 - t1,
            "concurrent_s": t3 - t2,
            "stats": msgspec.to_builtins(engine.stats()),
        }


def compare(a, b) -> tuple[int, list[dict]]:
    """(requests equal in tokens and exit depths, the first divergence of each other request)."""
    same, diffs = 0, []
    for i, ((ta, da), (tb, db)) in enumerate(zip(a, b)):
        if ta == tb and da == db:
            same += 1
        else:
            k = next(
                (j for j in range(min(len(ta), len(tb))) if ta[j] != tb[j] or da[j] != db[j]),
                min(len(ta), len(tb)),
            )  # else one is a prefix of the other
            diffs.append({"request": i, "first_divergence": k})
    return same, diffs


def parity(model: str, topology: str, prompts: list[list[int]], max_tokens: int, **launch) -> dict:
    """single against `topology` on the same prompts; launch: rlt.Engine.launch's other arguments."""
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    single = asyncio.run(serve(model, "single", prompts, sp, **launch))
    pd = asyncio.run(serve(model, topology, prompts, sp, **launch))
    report = {}
    for mode in ("sequential", "concurrent"):
        same, diffs = compare(single[mode], pd[mode])
        report[mode] = {
            "match": same,
            "of": len(prompts),
            "diffs": diffs,
            "single_s": round(single[f"{mode}_s"], 2),
            "pd_s": round(pd[f"{mode}_s"], 2),
        }
    report["ready_s"] = {"single": round(single["ready_s"], 1), topology: round(pd["ready_s"], 1)}
    return report


def command(args) -> None:
    """`rlt bench parity`: random prompts of --lengths (seed 0), the report printed as JSON."""
    from rlt.models.default_model import default_model_path

    model = args.model or default_model_path()
    mc = rlt.ModelConfig.from_pretrained(model)
    rng = random.Random(0)
    lengths = [int(n) for n in args.lengths.split(",")]
    prompts = [[rng.randrange(3, mc.vocab_size) for _ in range(n)] for n in lengths]
    launch = dict(
        device=args.device,
        dtype=args.dtype,
        kv_memory_bytes=int(args.kv_gib * 2**30),
        prefill_chunk=args.prefill_chunk,
        max_num_seqs=64,
        max_num_batched_tokens=max(4096, args.prefill_chunk),
        startup_timeout=900.0,
        heartbeat_timeout=120.0,
        batch_invariant=args.batch_invariant,
    )
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "model": model,
        "family": mc.family,
        "device": args.device,
        "dtype": args.dtype,
        "batch_invariant": args.batch_invariant,
        "lengths": args.lengths,
        "max_tokens": args.max_tokens,
        "command": " ".join(sys.argv),
        **parity(model, args.topology, prompts, args.max_tokens, **launch),
    }
    print(json.dumps(report, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
