"""Issue #6's P4 verdict from two serving-benchmark JSON files (`rlt bench serve --json-out`):

    python scripts/compare_serving.py serve_1p1d.json serve_2x.json

For every rate the replicas ran up to their capacity (their highest rate not past capacity): 1P1D
output throughput >= 97 % of the replicas', p95 TTFT <= 1.2x theirs, p95 TPOT <= 0.5x theirs. A
rate without a 1P1D row with completions (its sweep stopped below it, past its own capacity, or
the run was cut short) fails. Prints a row per rate and exits non-zero unless every checked rate
passes. (Which rates were past capacity is the benchmark's `saturated`, rlt/bench/serving.py.)
"""

import json
import sys

from rlt.bench.serving import percentile

LIMITS = {"throughput": 0.97, "ttft": 1.2, "tpot": 0.5}


def compare(pd_rows: list[dict], rep_rows: list[dict]) -> list[dict]:
    pd = {p["rate"]: p for p in pd_rows}
    capacity = max((r["rate"] for r in rep_rows if not r.get("saturated")), default=None)
    out = []
    for r in sorted(rep_rows, key=lambda r: r["rate"]):
        if capacity is None or r["rate"] > capacity:
            continue
        p = pd.get(r["rate"])
        if p is None or not p.get("completed"):
            out.append({"rate": r["rate"], "throughput": None, "ttft": None, "tpot": None, "ok": False})
            continue
        row = {
            "rate": r["rate"],
            "throughput": round(p["output_throughput_tok_s"] / r["output_throughput_tok_s"], 3),
            "ttft": round(p["p95_ttft_ms"] / r["p95_ttft_ms"], 3),
            "tpot": round(p["p95_tpot_ms"] / r["p95_tpot_ms"], 3),
        }
        row["ok"] = (
            row["throughput"] >= LIMITS["throughput"]
            and row["ttft"] <= LIMITS["ttft"]
            and row["tpot"] <= LIMITS["tpot"]
        )
        out.append(row)
    return out


def ttft_by_prompt_len(pd_rows: list[dict], rep_rows: list[dict]) -> dict:
    """{rate: {prompt length: (p95 TTFT 1p1d, p95 TTFT 2x)}} from the per-request records (JSON
    written since 508324b)."""

    def p95s(row):
        lens = {}
        for n, ttft, _ in row.get("requests", []):
            lens.setdefault(n, []).append(ttft)
        return {n: round(percentile(v, 95), 1) for n, v in sorted(lens.items())}

    rep = {r["rate"]: p95s(r) for r in rep_rows}
    out = {}
    for p in pd_rows:
        a, b = p95s(p), rep.get(p["rate"], {})
        if a and b:
            out[p["rate"]] = {n: (a[n], b.get(n)) for n in a}
    return out


def main(argv: list[str]) -> int:
    pd, rep = (json.load(open(a))["rows"] for a in argv[:2])
    rows = compare(pd, rep)
    print(f"{'rate':>6} {'tput 1p1d/2x':>13} {'p95 TTFT ratio':>15} {'p95 TPOT ratio':>15}  P4")
    for r in rows:
        if r["throughput"] is None:
            print(f"{r['rate']:>6} {'no 1p1d row at this rate':>45}  MISSED")
            continue
        print(f"{r['rate']:>6} {r['throughput']:>13} {r['ttft']:>15} {r['tpot']:>15}  {'ok' if r['ok'] else 'MISSED'}")
    by_len = ttft_by_prompt_len(pd, rep)
    if by_len:
        print("p95 TTFT ms by prompt length (1p1d / 2x):")
        for rate, lens in by_len.items():
            print(f"{rate:>6} " + "  ".join(f"{n} tokens: {a} / {b}" for n, (a, b) in lens.items()))
    passed = bool(rows) and all(r["ok"] for r in rows)
    print(
        "P4",
        "met" if passed else "not met",
        f"(limits: throughput >= {LIMITS['throughput']}, p95 TTFT <= {LIMITS['ttft']}x, p95 TPOT <= {LIMITS['tpot']}x)",
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
