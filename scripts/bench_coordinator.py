"""Coordinator overhead: the same worker engine driven in-process vs through rlt.Engine.

    python scripts/bench_coordinator.py [--model DIR] [--requests 64] [--max-tokens 64]

TTFT: one request (16-token prompt), from submission to its first token, median of --ttft-runs.
Throughput: --requests concurrent greedy requests streaming --max-tokens tokens each; output tokens/s.
The measurement is rlt/bench/coordinator.py.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from rlt.bench.coordinator import direct, through_engine
from rlt.default_model import default_model_path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-runs", type=int, default=20)
    ap.add_argument("--commit", help="recorded with the results (default: git rev-parse --short HEAD)")
    args = ap.parse_args()
    path = args.model or default_model_path()
    d_ttft, d_tps = direct(path, args.requests, args.max_tokens, args.ttft_runs)
    import uvloop

    e_ttft, e_tps = uvloop.run(through_engine(path, args.requests, args.max_tokens, args.ttft_runs))
    commit = (
        args.commit
        or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "commit": commit,
                "cpus": os.cpu_count(),
                "model": path,
                "command": " ".join(sys.argv),
            }
        )
    )
    print(f"{'':>22} {'TTFT ms':>9} {'tok/s':>9}")
    print(f"{'direct (in-process)':>22} {d_ttft * 1e3:>9.2f} {d_tps:>9.1f}")
    print(f"{'rlt.Engine':>22} {e_ttft * 1e3:>9.2f} {e_tps:>9.1f}")
    print(f"added TTFT {1e3 * (e_ttft - d_ttft):.2f} ms; throughput ratio {e_tps / d_tps:.3f}")


if __name__ == "__main__":
    main()
