"""Start 1 prefill + 1 decode worker and stream generations, with per-request TTFT and TPOT.

    python scripts/launch_1p1d.py [--model DIR] [--max-tokens 32] "prompt one" "prompt two"
    echo "a prompt per line" | python scripts/launch_1p1d.py --option prefill_worker_chunk=4096

Workers go on cuda:0 and cuda:1 when two GPUs are visible, on the CPU otherwise. Without --model
the embedded default (a tiny Ouro made on first use) is served. --option NAME=VALUE (repeatable)
passes any rlt.Engine.launch option (README "Python API"); VALUE is read as JSON, else as a string.
"""

import argparse
import asyncio
import json
import sys
import time

import rlt
from rlt.control.run import run_command


def option(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def pick_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    except ImportError:
        return "cpu"


async def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("prompts", nargs="*", help="prompts (default: one per line from stdin)")
    ap.add_argument("--model")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--exit-threshold", type=float)
    ap.add_argument(
        "--device", default=None, help="cpu or cuda (default: cuda with 2+ GPUs, else cpu)"
    )
    ap.add_argument("--dtype")
    ap.add_argument("--hf-overrides", type=json.loads)
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        type=option,
        metavar="NAME=VALUE",
        help="an rlt.Engine.launch option, e.g. prefill_worker_chunk=4096 (repeatable)",
    )
    args = ap.parse_args()
    prompts = args.prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        ap.error("give prompts as arguments or on stdin")
    device = args.device or pick_device()
    t0 = time.perf_counter()
    try:
        launch = rlt.Engine.launch(
            args.model,
            topology="1p1d",
            device=device,
            dtype=args.dtype,
            hf_overrides=args.hf_overrides,
            **dict(args.option),
        )
    except (ValueError, TypeError) as err:  # a bad option (or one given twice): nothing was started
        ap.error(str(err))
    async with launch as engine:
        roles = ", ".join(f"{w.role} pid {w.pid}" for w in engine.stats().workers)
        print(f"ready in {time.perf_counter() - t0:.1f} s on {device}: {roles}", file=sys.stderr)
        sp = rlt.SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            exit_threshold=args.exit_threshold,
        )

        async def one(i: int, prompt: str):
            start = time.perf_counter()
            first = last = None
            async for out in engine.generate(prompt, sp, request_id=f"req-{i}"):
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
            n = len(out.token_ids)
            ttft = (first - start) * 1e3
            tpot = (last - first) * 1e3 / (n - 1) if n > 1 else 0.0
            print(f"[req-{i}] {prompt!r} -> {out.text!r}")
            print(
                f"[req-{i}] {n} tokens ({out.finish_reason}), exit depths {out.exit_depths}, "
                f"TTFT {ttft:.1f} ms, TPOT {tpot:.1f} ms"
            )

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(run_command(main()))
    # the engine was shut down on the way out: workers and temp files gone
    except KeyboardInterrupt:
        print("launch_1p1d: interrupted", file=sys.stderr)
        sys.exit(130)
