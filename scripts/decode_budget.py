"""`decode_pass_rows` chosen by measurement: `rlt bench serve` once per value and round (each a
fresh engine; the values alternate round by round), then one table against the first value
(today's default goes first):

    python scripts/decode_budget.py --values 8192,1536 --rounds 3 --out /tmp/budget -- \
        --model /tmp/ouro-full --device cuda --rates "" --max-concurrency 64 --num-prompts 192 \
        --prompt-lens 1024 --output-len 256

Per load: output tok/s, TTFT p50, p95 TTFT and TPOT, ITL p50 / p99 and p99 / p50, each the mean
over the rounds with its spread (min..max), and the mean's ratio to the first value's. Closed-loop
TTFT medians move by a step between runs (docs/performance.md), hence the interleaved rounds.
"""

import argparse
import json
import os
import subprocess
import sys


def run(value: int, rnd: int, out: str, bench: list[str]) -> list[dict]:
    path = os.path.join(out, f"rows{value}_round{rnd}.json")
    cmd = [sys.executable, "-m", "rlt", "bench", "serve", *bench, "--decode-pass-rows", str(value), "--json-out", path]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(path) as f:
        return json.load(f)["rows"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def cell(values: list[float], ref: list[float]) -> str:
    spread = f" [{min(values):.1f}..{max(values):.1f}]" if len(values) > 1 else ""
    return f"{mean(values):.1f}{spread} ×{mean(values) / mean(ref):.3f}"


def table(results: dict[int, list[list[dict]]]) -> None:
    """results: per value, per round, `rlt bench serve`'s rows (one per load)."""
    cols = ["output tok/s", "TTFT p50 ms", "p95 TTFT ms", "p95 TPOT ms", "ITL p50 ms", "ITL p99 ms"]
    keys = ["output_throughput_tok_s", "median_ttft_ms", "p95_ttft_ms", "p95_tpot_ms", "median_itl_ms", "p99_itl_ms"]
    base = next(iter(results.values()))
    print("| decode_pass_rows | load | " + " | ".join(f"{c}" for c in cols) + " | ITL p99/p50 |")
    print("|---" * (len(cols) + 3) + "|")
    for value, rounds in results.items():
        for i, row in enumerate(rounds[0]):
            load = row.get("rate", f"{row.get('concurrency')} at once")
            per_key = {k: [r[i][k] for r in rounds] for k in keys}
            ref = {k: [r[i][k] for r in base] for k in keys}
            cells = [cell(per_key[k], ref[k]) for k in keys]
            tail = mean(per_key["p99_itl_ms"]) / mean(per_key["median_itl_ms"])
            print(f"| {value} | {load} | " + " | ".join(cells) + f" | {tail:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--values", required=True, help="decode_pass_rows values, the baseline first")
    p.add_argument("--rounds", type=int, default=1, help="each value this many times, alternating")
    p.add_argument("--out", required=True, help="a folder for each run's JSON")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `rlt bench serve` arguments")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    values = [int(v) for v in args.values.split(",")]
    results: dict[int, list[list[dict]]] = {v: [] for v in values}
    for rnd in range(args.rounds):
        for v in values:
            results[v].append(run(v, rnd, args.out, bench))
    table(results)


if __name__ == "__main__":
    main()
