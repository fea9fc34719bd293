"""Decode against its HBM roofline, #36's table in one run: for each model (Ouro-1.4B and
Nanbeige4.2-3B shapes by default) and context (1K and 8K), `rlt bench offline --floors` at
concurrency 1, 4, 8 and 128, fixed depth: tok/s while every request runs, the roofline from the
same run's measured copy rate (a step's bytes: core weights and every row's KV per loop, the LM
head), and the ratio. A concurrency whose KV (prompt + max_tokens per request, on every plane)
does not fit --kv-gib is skipped and said so: Ouro-1.4B's 128 requests of 8K need 0.8 TB.

    python scripts/decode_roofline.py --models /tmp/ouro,/tmp/nb --json-out decode_roofline.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from rlt.config import ModelConfig


def kv_bytes_per_token(model: str) -> int:
    """Every plane's K and V of one position (LAST_EXITED: a core plane per loop depth; bf16)."""
    mc = ModelConfig.from_pretrained(model)
    return mc.kv.bytes_per_token(mc.depth, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="/tmp/ouro,/tmp/nb")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--concurrency", default="1,4,8,128")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-gib", type=float, default=120)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    table = []
    for model in args.models.split(","):
        per_token = kv_bytes_per_token(model)
        for ctx in map(int, args.contexts.split(",")):
            fits, skipped = [], []
            for c in map(int, args.concurrency.split(",")):
                need = c * (ctx + args.max_tokens) * per_token
                (fits if need <= args.kv_gib * 2**30 else skipped).append((c, need))
            for c, need in skipped:
                print(f"{model} {ctx}: concurrency {c} skipped, its KV is {need / 2**30:.1f} GiB > --kv-gib")
            if not fits:
                continue
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [sys.executable, "-m", "rlt", "bench", "offline", "--model", model, "--device", "cuda"]
                cmd += ["--concurrency", ",".join(str(c) for c, _ in fits), "--threshold", "1.0"]
                cmd += ["--prompt-len", str(ctx), "--max-tokens", str(args.max_tokens), "--kv-gib", str(args.kv_gib)]
                subprocess.run([*cmd, "--floors", "--json-out", f.name], check=True)
                rows = json.load(f)["rows"]
            for r in rows:
                table.append(
                    {
                        "model": os.path.basename(model.rstrip("/")),
                        "context": ctx,
                        "concurrency": r["concurrency"],
                        "tok_per_s": r["full_conc_tok_per_s"],
                        "roofline_tok_per_s": r["roofline_tok_per_s"],
                        "of_roofline": r.get("of_roofline"),
                    }
                )
    print(f"{'model':>10} {'context':>8} {'conc':>5} {'tok/s':>10} {'roofline':>10} {'of roof':>8}")
    for t in table:
        print(
            f"{t['model']:>10} {t['context']:>8} {t['concurrency']:>5} {t['tok_per_s']:>10} "
            f"{t['roofline_tok_per_s']:>10} {t['of_roofline']!s:>8}"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": table}, f, indent=2)


if __name__ == "__main__":
    main()
