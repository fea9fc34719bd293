"""KV handoff bandwidth: one prompt's KV blocks written by NIXL from a "prefill" process's pool into
a "decode" process's pool, through rlt's own KVTransport (the path PD uses).

    python scripts/bench_kv_handoff.py [--tokens 4096] [--src cuda:0 --dst cuda:1]

Geometry defaults to Nanbeige4.2-3B (22 layers, 8 KV heads, head_dim 128, 2 loop planes, bf16,
16-position blocks): a 4096-token prompt is 512 blocks of 1.375 MiB = 704 MiB. Two layouts: the
blocks consecutive on both sides (runs merge into one descriptor per plane) and scattered (one
descriptor per block). The received bytes are checked against the sent ones. The measurement is
rlt/bench/kv_handoff.py.
"""

import argparse
import dataclasses
import json
import sys
import time

from rlt.bench.kv_handoff import Handoff, measure


def main():
    ap = argparse.ArgumentParser()
    for f in dataclasses.fields(Handoff):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    h = Handoff(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Handoff)})
    results = measure(h)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "src": h.src,
        "dst": h.dst,
        "tokens": h.tokens,
        "command": " ".join(sys.argv),
    }
    print(json.dumps(meta))
    for r in results:
        print(
            f"{r['layout']:>12}: {r['blocks']} blocks, {r['bytes'] / 2**20:.0f} MiB, "
            f"{r['median_ms']} ms, {r['GB_per_s']} GB/s"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
