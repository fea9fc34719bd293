"""What the HTTP server adds: the same closed-loop workload through `rlt serve` (HTTP, streamed
/v1/completions) and through rlt.Engine in process, one after the other in one run, with the
engine's default options in both.

    python scripts/serve_overhead.py --model DIR --device cuda --concurrency 1,64 \\
        --prompt-len 1024 --output-len 256 --json-out serve_overhead.json

Prints the server process's CPU time per streamed token (its workers are other processes), then a
row per concurrency and path (`rlt bench serve`'s metrics), then HTTP over in process:
output tok/s as a ratio and p50 TTFT as milliseconds added. The server's own log goes
beside --json-out.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(args, out: str, *extra: str) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "rlt",
        "bench",
        "serve",
        "--model",
        args.model,
        "--device",
        args.device,
        "--rates",
        "",
        "--max-concurrency",
        args.concurrency,
        "--prompt-lens",
        str(args.prompt_len),
        "--output-len",
        str(args.output_len),
        "--json-out",
        out,
        *extra,
    ]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)["rows"]


def server_cpu_s(pid: int) -> float:
    """The server process's own CPU seconds (user + system; its workers are other processes)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generated_tokens(url: str) -> float:
    """rlt:generation_tokens_total from the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("rlt:generation_tokens_total")
    )


def serve_and_bench(args, out: str) -> list[dict]:
    port = free_port()
    log = open(os.path.splitext(args.json_out)[0] + "_server.log", "w")
    cmd = [sys.executable, "-m", "rlt", "serve", args.model, "--port", str(port), "--device", args.device]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while "ready at" not in (line := server.stdout.readline()):
            if not line or time.monotonic() > deadline:
                raise SystemExit(f"rlt serve did not start (exit {server.poll()}): see {log.name}")
        url = f"http://127.0.0.1:{port}"
        cpu0, tokens0 = server_cpu_s(server.pid), generated_tokens(url)
        rows = bench(args, out, "--base-url", url + "/v1")
        cpu, tokens = server_cpu_s(server.pid) - cpu0, generated_tokens(url) - tokens0
        rows[0]["server_cpu_us_per_token"] = round(cpu / tokens * 1e6, 1)  # (warm-up's tokens included)
        return rows
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json-out", default="serve_overhead.json")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    stem = os.path.splitext(args.json_out)[0]
    http = serve_and_bench(args, stem + "_http.json")
    local = bench(args, stem + "_inprocess.json")
    rows = []
    print(
        f"{'in flight':>9} {'HTTP tok/s':>11} {'in-proc tok/s':>14} {'ratio':>6} {'HTTP p50 TTFT':>14} "
        f"{'in-proc p50 TTFT':>17} {'added ms':>9}"
    )
    print(f"server CPU per streamed token: {http[0]['server_cpu_us_per_token']} us")
    for h, p in zip(http, local):
        row = {
            "concurrency": h["concurrency"],
            "http_tok_s": h["output_throughput_tok_s"],
            "inprocess_tok_s": p["output_throughput_tok_s"],
            "ratio": round(h["output_throughput_tok_s"] / p["output_throughput_tok_s"], 4),
            "http_p50_ttft_ms": h["median_ttft_ms"],
            "inprocess_p50_ttft_ms": p["median_ttft_ms"],
            "ttft_added_ms": round(h["median_ttft_ms"] - p["median_ttft_ms"], 2),
        }
        rows.append(row)
        print(" ".join(f"{v:>{w}}" for v, w in zip(row.values(), (9, 11, 14, 6, 14, 17, 9))))
    with open(args.json_out, "w") as f:
        cpu = http[0]["server_cpu_us_per_token"]
        json.dump({"command": " ".join(sys.argv), "server_cpu_us_per_token": cpu, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
