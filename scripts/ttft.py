"""Time to first token of one request at a time, through rlt.Engine with default options.

    python scripts/ttft.py --model /tmp/ouro-full --device cuda --prompt-lens 128,1024 --max-tokens 1,256

For each (max_tokens, prompt length): 8 requests one after another (random token ids, greedy, EOS
ignored), the median, min and max TTFT and the median submission-to-last-token time.
`--prefill-chunk N` sets the rows a prompt takes per pass (PD's prefill worker: prefill_worker_chunk).
"""

import argparse
import asyncio
import random
import statistics
import time

import rlt
from rlt import SamplingParams


async def main(args):
    chunk = {"prefill_chunk": args.prefill_chunk} if args.prefill_chunk else {}
    async with rlt.Engine.launch(args.model, device=args.device, startup_timeout=900, **chunk) as engine:
        rng = random.Random(0)
        vocab = engine.model_config.vocab_size

        async def one(n, max_tokens):
            prompt = [rng.randrange(3, vocab) for _ in range(n)]
            sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
            t0, first = time.perf_counter(), None
            async for _ in engine.generate(prompt, sp):
                first = first or time.perf_counter() - t0
            return first * 1e3, (time.perf_counter() - t0) * 1e3

        for max_tokens in map(int, args.max_tokens.split(",")):
            for n in map(int, args.prompt_lens.split(",")):
                runs = [await one(n, max_tokens) for _ in range(args.repeat)]
                ttft, e2e = [r[0] for r in runs], statistics.median(r[1] for r in runs)
                print(
                    f"prompt {n:5d} max_tokens {max_tokens:4d}: TTFT ms median {statistics.median(ttft):7.2f} "
                    f"min {min(ttft):7.2f} max {max(ttft):7.2f}  e2e median {e2e:8.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--max-tokens", default="1,256")
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--prefill-chunk", type=int, help="rows a prompt takes per pass (default: the engine's)")
    asyncio.run(main(ap.parse_args()))
