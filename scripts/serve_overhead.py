"""What the HTTP server adds: the same workload through `rlt serve` (HTTP, streamed
/v1/completions) and through rlt.Engine in process, alternating for --rounds rounds in one run,
with the same engine options in both (the defaults, or those after `--`).

    python scripts/serve_overhead.py --model DIR --device cuda --concurrency 64,256 --rates 8 \\
        --prompt-len 1024 --output-len 256 --rounds 3 --json-out serve_overhead.json [-- --decode-pass-rows 8192]

Workload: Poisson arrivals at each of --rates for --duration s, then closed loops at each of
--concurrency (`rlt bench serve`'s). Prints the server process's CPU time per streamed token (its
workers are other processes), then per workload HTTP against in process: output tok/s as a ratio
and p50 / p99 TTFT as milliseconds added, mean over the rounds with their spread (min..max),
and each round's p99 ITL. Closed-loop TTFT medians move by a step between runs, hence the
interleaved rounds. --ramp S starts the closed loops' clients over S seconds on both sides: in
process they otherwise all reach the worker before its first pass and run in aligned waves, which
HTTP's arrivals cannot. The server's own log goes beside --json-out. Engine options after `--`
go to both sides (`rlt serve` and `rlt bench serve` take the same flags), e.g. to A/B a
scheduling option under both.
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
        args.rates,
        "--duration",
        str(args.duration),
        "--max-concurrency",
        args.concurrency,
        "--prompt-lens",
        str(args.prompt_len),
        "--output-len",
        str(args.output_len),
        "--ramp",
        str(args.ramp),
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
    cmd = [sys.executable, "-m", "rlt", "serve", args.model, "--port", str(port), "--device", args.device, *args.engine]
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


def spread(values: list[float], digits: int) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f}" + (f" ({min(values):.{digits}f}..{max(values):.{digits}f})" if len(values) > 1 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,64", help="closed loops (e.g. 64,256; '' for none)")
    ap.add_argument("--rates", default="", help="Poisson arrival rates, req/s (e.g. 8)")
    ap.add_argument("--duration", type=float, default=20, help="seconds of arrivals per rate")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="HTTP then in process, this many times")
    ap.add_argument("--ramp", type=float, default=0.0, help="closed loops' clients start over this many s (both sides)")
    ap.add_argument("--json-out", default="serve_overhead.json")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.engine = argv[cut + 1 :]
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    stem = os.path.splitext(args.json_out)[0]
    rounds = []
    for i in range(args.rounds):
        http = serve_and_bench(args, f"{stem}_http{i}.json")
        rounds.append((http, bench(args, f"{stem}_inprocess{i}.json", *args.engine)))
    cpu = [h[0]["server_cpu_us_per_token"] for h, _ in rounds]
    print(f"server CPU per streamed token: {spread(cpu, 1)} us")
    print(
        f"{'workload':>12} {'HTTP / in-process tok/s':>26} {'p50 TTFT added ms':>24} {'p99 TTFT added ms':>24}"
        "  p99 ITL ms, HTTP / in process"
    )
    rows = []
    for k, row in enumerate(rounds[0][0]):
        name = f"rate {row['rate']}" if "rate" in row else f"{row['concurrency']} in flight"
        pairs = [(h[k], p[k]) for h, p in rounds]
        out = {
            "workload": name,
            "ratio": [round(h["output_throughput_tok_s"] / p["output_throughput_tok_s"], 4) for h, p in pairs],
            "p50_ttft_added_ms": [round(h["median_ttft_ms"] - p["median_ttft_ms"], 2) for h, p in pairs],
            "p99_ttft_added_ms": [round(h["p99_ttft_ms"] - p["p99_ttft_ms"], 2) for h, p in pairs],
            "http_tok_s": [h["output_throughput_tok_s"] for h, _ in pairs],
            "inprocess_tok_s": [p["output_throughput_tok_s"] for _, p in pairs],
            "http_p50_p99_ttft_ms": [(h["median_ttft_ms"], h["p99_ttft_ms"]) for h, _ in pairs],
            "inprocess_p50_p99_ttft_ms": [(p["median_ttft_ms"], p["p99_ttft_ms"]) for _, p in pairs],
            "http_inprocess_p99_itl_ms": [(h["p99_itl_ms"], p["p99_itl_ms"]) for h, p in pairs],
        }
        rows.append(out)
        print(
            f"{name:>12} {spread(out['ratio'], 4):>26} {spread(out['p50_ttft_added_ms'], 2):>24} "
            f"{spread(out['p99_ttft_added_ms'], 2):>24}  "
            + ", ".join(f"{h} / {p}" for h, p in out["http_inprocess_p99_itl_ms"])
        )
    with open(args.json_out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "server_cpu_us_per_token": cpu, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
