"""Chat users who stop long answers: N requests with P-token prompts and max_tokens 8192, all sent
at once, each consumer stopping after K output tokens (issue #17's workload). With blocks taken as
requests grow they all run from the start; reserving prompt + max_tokens would admit a few.

    python scripts/long_answers.py --model DIR [--device cuda] [--requests 64] [--prompt-len 1024]
"""

import argparse
import asyncio
import time

import rlt
from rlt import SamplingParams


async def main(args):
    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900) as engine:
        w = engine.stats().workers[0]
        sp = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
        print(f"KV pool: {w.kv_blocks_total} blocks", flush=True)
        running_max, first = 0, []
        t0 = time.perf_counter()

        async def one(i):
            prompt = [3 + (i * 7 + j) % 500 for j in range(args.prompt_len)]
            n = 0
            async for out in engine.generate(prompt, sp):
                n = len(out.token_ids)
                if n == 1:
                    first.append(time.perf_counter() - t0)
                if n >= args.stop_after:
                    break  # the consumer stops: the request is aborted
            return n

        async def watch():
            nonlocal running_max
            while True:
                running_max = max(running_max, engine.stats().workers[0].running)
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(watch())
        counts = await asyncio.gather(*(one(i) for i in range(args.requests)))
        dt = time.perf_counter() - t0
        watcher.cancel()
        await asyncio.sleep(0.5)
        w = engine.stats().workers[0]
        first.sort()
        print(
            f"{args.requests} requests x {args.prompt_len}-token prompts, max_tokens {args.max_tokens}, stopped "
            f"after {args.stop_after}: {dt:.1f} s, {sum(counts) / dt:.0f} output tok/s, running at once up to "
            f"{running_max}, last first token at {first[-1]:.2f} s, preemptions {w.preemptions}, "
            f"afterwards live {engine.stats().live_requests}, free blocks {w.kv_blocks_free}/"
            f"{w.kv_blocks_total}, captures/compiles after READY {w.captures_after_ready}/"
            f"{w.compiles_after_ready}",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--stop-after", type=int, default=1024)
    asyncio.run(main(ap.parse_args()))
