"""`decode_pass_rows` chosen by measurement: `rlt bench serve` once per value (each a fresh engine),
then one table against the first value (today's default goes first):

    python scripts/decode_budget.py --values 8192,2048,1024 --out /tmp/budget -- \
        --model /tmp/ouro-full --device cuda --rates "" --max-concurrency 64 --num-prompts 256 \
        --prompt-lens 1024 --output-len 256

Closed loops: output tok/s, TTFT p50, ITL p50 / p99 and p99 / p50, with ratios to the first value.
Poisson rates: p95 TTFT and p95 TPOT per rate, with ratios to the first value.
"""

import argparse
import json
import os
import subprocess
import sys


def run(value: int, out: str, bench: list[str]) -> list[dict]:
    path = os.path.join(out, f"rows{value}.json")
    cmd = [sys.executable, "-m", "rlt", "bench", "serve", *bench, "--decode-pass-rows", str(value), "--json-out", path]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(path) as f:
        return json.load(f)["rows"]


def ratio(a, b) -> str:
    return f"{a / b:.3f}" if a is not None and b else "-"


def table(results: dict[int, list[dict]]) -> None:
    base = next(iter(results.values()))
    cols = ["output tok/s", "TTFT p50 ms", "p95 TTFT ms", "p95 TPOT ms"]
    keys = ["output_throughput_tok_s", "median_ttft_ms", "p95_ttft_ms", "p95_tpot_ms"]
    print("| decode_pass_rows | load | " + " | ".join(f"{c} (×)" for c in cols) + " | ITL p50 / p99 ms | p99/p50 |")
    print("|---" * (len(cols) + 4) + "|")
    for value, rows in results.items():
        for row, ref in zip(rows, base):
            load = row.get("rate", f"{row.get('concurrency')} at once")
            cells = [f"{row[k]} ({ratio(row[k], ref[k])})" for k in keys]
            itl = f"{row['median_itl_ms']} / {row['p99_itl_ms']} | {ratio(row['p99_itl_ms'], row['median_itl_ms'])}"
            print(f"| {value} | {load} | " + " | ".join(cells) + f" | {itl} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--values", required=True, help="decode_pass_rows values, the baseline first")
    p.add_argument("--out", required=True, help="a folder for each run's JSON")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `rlt bench serve` arguments")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    results = {v: run(v, args.out, bench) for v in map(int, args.values.split(","))}
    table(results)


if __name__ == "__main__":
    main()
