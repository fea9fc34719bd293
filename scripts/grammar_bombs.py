"""What grammar bombs do to a running stream (issue #61's inter-token gap), against `rlt serve`:

a plain stream (EOS ignored) is read by a separate process while this one sends, all at once,
  - none: nothing (the stream's own jitter),
  - plain: `--count` ordinary one-token requests (the cost of any arrivals),
  - bombs: `--count` choices of 2,000 long strings (217 KB each, seconds to compile: killed at the
    1 s compile deadline, each a 400);
and reports the stream's inter-token gaps from the first send to the last answer: median, p99 and
largest, and the largest gap over its neighbours' median (the 50 gaps around it: the context grows).

    python scripts/grammar_bombs.py [--model DIR] [--tokens 4000]

Without --model: the embedded tiny Ouro, as the tests serve it (CPU).
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# The stream's reader: one line "started" after 20 tokens, then the arrival times as JSON.
READER = r"""
import gc, http.client, json, sys, time
gc.disable()
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
body = {"model": "m", "prompt": "The river", "max_tokens": int(sys.argv[2]), "stream": True, "ignore_eos": True}
conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
r, t = conn.getresponse(), []
while (line := r.readline()) and not line.startswith(b"data: [DONE]"):
    if line.startswith(b"data: {"):
        t.append(time.monotonic())
        if len(t) == 20:
            print("started", flush=True)
print(json.dumps(t))
"""


def bodies(kind: str, count: int, salt: int = 0) -> list[bytes]:
    """(salt: bombs no worker has seen: a failed grammar's 400 is cached)"""
    if kind == "plain":
        return [json.dumps({"prompt": "x", "max_tokens": 1}).encode()] * count
    choice = lambda k: [f"bomb {salt}.{k} entry {i} " * 6 for i in range(2000)]  # noqa: E731
    return [json.dumps({"prompt": "x", "structured_outputs": {"choice": choice(k)}}).encode() for k in range(count)]


def post(port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def scenario(port: int, kind: str, count: int, tokens: int, salt: int) -> dict:
    sent = bodies(kind, count, salt) if kind != "none" else []  # (built before the stream starts)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(port), str(tokens)], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().startswith("started")
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda b=b: statuses.append(post(port, b))) for b in sent]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1 = max(time.monotonic(), t0 + 1.0)  # (none: its first second)
    arrivals = json.loads(reader.communicate()[0])
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    window = [i for i in range(len(gaps)) if t0 <= arrivals[i + 1] and arrivals[i] <= t1]
    local = [gaps[i] / statistics.median(gaps[max(0, i - 25) : i + 25]) for i in window]
    inside = sorted(gaps[i] for i in window)
    return {
        "scenario": kind,
        "answers": ",".join(sorted({str(s) for s in statuses})) or "-",
        "window s": round(t1 - t0, 2),
        "gaps": len(inside),
        "median ms": round(1e3 * statistics.median(inside), 1),
        "p99 ms": round(1e3 * inside[int(0.99 * (len(inside) - 1))], 1),
        "max ms": round(1e3 * inside[-1], 1),
        "max/local median": round(max(local), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint directory (default: the tiny Ouro)")
    ap.add_argument("--tokens", type=int, default=4000, help="the stream's length: it outlasts the bombs")
    ap.add_argument("--count", type=int, default=8, help="requests sent at once (default: 8)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from rlt.models.checkpoint import make_checkpoint

            model = make_checkpoint("ouro", os.path.join(tmp, "ouro"), preset="tiny", seed=1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [sys.executable, "-m", "rlt", "serve", model, "--port", str(port), "--served-model-name", "m"]
        server = subprocess.Popen([*argv, "--grammar-compile-timeout", "1"], stdout=subprocess.PIPE, text=True)
        try:
            assert "ready at" in server.stdout.readline()
            post(port, bodies("bombs", 1, -1)[0])  # (the compile pool started and warm)
            rows = [scenario(port, k, args.count, args.tokens, r) for r in range(args.repeat) for k in KINDS]
        finally:
            server.terminate()
            server.wait()
    cols = list(rows[0])
    print("  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]!s:>16}" for c in cols))
    return 0


KINDS = ("none", "plain", "bombs")

if __name__ == "__main__":
    sys.exit(main())
