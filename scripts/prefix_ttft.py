"""A second chat turn's time to first token, cold and on a cached prefix, through rlt.Engine with
default options (prefix caching on).

    python scripts/prefix_ttft.py --model /tmp/nanbeige-full --device cuda --prefix-len 4096 --new-len 128

Per repetition, a fresh random `prefix-len`-token first turn (its own output, `--first-output`
tokens, ends it); then the second turn, the first prompt + `--new-len` new tokens, takes its first
token on the cached prefix (`warm`); `cold` is a request of the same length sharing nothing with
anything before. Greedy, EOS ignored, one request at a time. Prints median, min, max TTFT of each,
the warm/cold ratio of the medians and the warm requests' num_cached_tokens.
"""

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rlt  # noqa: E402
from rlt import SamplingParams  # noqa: E402


async def main(args):
    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900) as engine:
        rng = random.Random(0)
        vocab = engine.model_config.vocab_size

        def tokens(n):
            return [rng.randrange(3, vocab) for _ in range(n)]

        async def ttft(prompt, max_tokens=1):
            sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
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
        print(
            f"warm/cold {statistics.median(warm) / statistics.median(cold):.3f}, "
            f"num_cached_tokens {sorted(set(cached))}",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefix-len", type=int, default=4096)
    ap.add_argument("--new-len", type=int, default=128)
    ap.add_argument("--first-output", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=8)
    asyncio.run(main(ap.parse_args()))
