"""`rlt bench prefix` and `rlt bench first-use`: workloads through rlt.Engine with default options
(the parsers: rlt/bench/cli.py).

prefix: per repetition, a fresh random `--prefix-len`-token first turn (with `--first-output`
tokens of its own), then the second turn, that prompt + `--new-len` new tokens, whose first token
comes on the cached prefix (`warm`); `cold` is a prompt of the same length sharing nothing. Greedy,
EOS ignored, one request at a time: median, min and max TTFT of each, warm/cold of the medians and
the warm requests' num_cached_tokens.

first-use: the phases below one after another, each with the CUDA-graph captures and Triton
compilations its workers made since READY (summed over the workers).
"""

import asyncio
import random
import statistics
import time

PHASES = [  # (name, prompt lengths, output tokens, exit threshold)
    ("one short request", [16], 32, 1.0),
    ("8 short", [16] * 8, 32, 1.0),
    ("8 short, adaptive exit", [16] * 8, 32, 0.5),
    ("one 1K prompt", [1024], 16, 1.0),
    ("mixed 128/4096 x8", [128, 4096] * 4, 32, 1.0),
    ("64 mixed lengths", [16 + 61 * i for i in range(64)], 48, 1.0),
    ("the same again", [16 + 61 * i for i in range(64)], 48, 1.0),
]


def prefix(args) -> None:
    asyncio.run(_prefix(args))


async def _prefix(args) -> None:
    import rlt

    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900) as engine:
        rng = random.Random(0)
        vocab = engine.model_config.vocab_size

        def tokens(n):
            return [rng.randrange(3, vocab) for _ in range(n)]

        async def ttft(prompt, max_tokens=1):
            sp = rlt.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
            t0, first = time.perf_counter(), None
            async for out in engine.generate(prompt, sp):
                first = first or (time.perf_counter() - t0) * 1e3
            return first, out.num_cached_tokens

        cold, warm, cached = [], [], []
        for _ in range(args.repeat):
            cold.append((await ttft(tokens(args.prefix_len + args.new_len)))[0])
            first = tokens(args.prefix_len)
            await ttft(first, args.first_output)
            t, c = await ttft(first + tokens(args.new_len))
            warm.append(t)
            cached.append(c)
        for name, v in (("cold", cold), ("warm", warm)):
            print(
                f"{name}: prompt {args.prefix_len + args.new_len} TTFT ms median {statistics.median(v):8.2f} "
                f"min {min(v):8.2f} max {max(v):8.2f}",
                flush=True,
            )
        ratio = statistics.median(warm) / statistics.median(cold)
        print(f"warm/cold {ratio:.3f}, num_cached_tokens {sorted(set(cached))}", flush=True)


def first_use(args) -> None:
    asyncio.run(_first_use(args))


async def _first_use(args) -> None:
    import rlt

    kv = dict(kv_memory_bytes=int(args.kv_gib * 2**30)) if args.kv_gib else {}
    async with rlt.Engine.launch(
        args.model, device=args.device, topology=args.topology, startup_timeout=900, **kv
    ) as engine:
        print(f"{'phase':<26} {'s':>6} {'captures':>9} {'compiles':>9}  (since READY)")
        for name, lens, out, thr in PHASES:
            t0 = time.perf_counter()
            sp = rlt.SamplingParams(
                max_tokens=out, temperature=0, ignore_eos=True, exit_threshold=thr
            )

            async def one(n, i, sp=sp):
                async for _ in engine.generate([3 + (i * 7 + j) % 500 for j in range(n)], sp):
                    pass

            await asyncio.gather(*(one(n, i) for i, n in enumerate(lens)))
            ws = engine.stats().workers
            captures = sum(w.captures_after_ready for w in ws)
            compiles = sum(w.compiles_after_ready for w in ws)
            print(
                f"{name:<26} {time.perf_counter() - t0:>6.2f} {captures:>9} {compiles:>9}",
                flush=True,
            )
