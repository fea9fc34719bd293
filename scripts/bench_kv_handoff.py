"""KV handoff bandwidth: one prompt's KV blocks written by NIXL from a "prefill" process's pool into
a "decode" process's pool, through rlt's own KVTransport (the path PD uses).

    python scripts/bench_kv_handoff.py [--tokens 4096] [--src cuda:0 --dst cuda:1]

Geometry defaults to Nanbeige4.2-3B (22 layers, 8 KV heads, head_dim 128, 2 loop planes, bf16,
16-position blocks): a 4096-token prompt is 512 blocks of 1.375 MiB = 704 MiB. Two layouts: the
blocks consecutive on both sides (runs merge into one descriptor per plane) and scattered (one
descriptor per block). The received bytes are checked against the sent ones.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _pool(args, device):
    import torch

    shape = (args.num_blocks, args.layers, 2, args.block_size, args.kv_heads, args.head_dim)
    return torch.zeros(shape, dtype=torch.bfloat16, device=device)


def decode(args, conn):
    import torch

    from rlt.workers.kv_transfer import KVTransport

    if args.dst.startswith("cuda"):
        torch.cuda.set_device(args.dst)
    cache = _pool(args, args.dst)
    t = KVTransport("decode", cache)
    conn.send(t.info())
    while True:
        msg = conn.recv()
        if msg is None:
            break
        dst, expect = msg
        got = 0
        while got < 1:
            got += len(t.notifications())
        checksum = float(cache[dst].float().sum()) if dst else 0.0
        conn.send((checksum, expect))
        cache.zero_()
    t.close()


def prefill(args, conn, out):
    import torch

    from rlt.workers.kv_transfer import KVTransport, wait_done

    if args.src.startswith("cuda"):
        torch.cuda.set_device(args.src)
    cache = _pool(args, args.src)
    cache.normal_()
    t = KVTransport("prefill", cache)
    peer = conn.recv()
    t.add_peer(peer)
    per_plane = -(-args.tokens // args.block_size)
    n = per_plane * args.planes
    g = torch.Generator().manual_seed(0)
    layouts = {"consecutive": (list(range(n)), list(range(n))),
               "scattered": (torch.randperm(args.num_blocks, generator=g)[:n].tolist(),
                             torch.randperm(args.num_blocks, generator=g)[:n].tolist())}
    nbytes = n * t.block_bytes
    results = []
    for name, (src, dst) in layouts.items():
        times = []
        for it in range(args.iters + 1):
            conn.send((dst, float(cache[src].float().sum())))
            if args.src.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            h = t.write("decode", src, dst, f"{it}:0".encode())
            wait_done(t, h, 60)
            dt = time.perf_counter() - t0
            t.release(h)
            got, expect = conn.recv()
            assert abs(got - expect) <= 1e-3 * max(1.0, abs(expect)), (name, got, expect)
            if it:
                times.append(dt)
        times.sort()
        med = times[len(times) // 2]
        results.append({"layout": name, "blocks": n, "bytes": nbytes, "median_ms": round(med * 1e3, 3),
                        "GB_per_s": round(nbytes / med / 1e9, 1), "checked": True})
    conn.send(None)
    out.put(results)
    t.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--planes", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=1200)
    ap.add_argument("--src", default="cuda:0")
    ap.add_argument("--dst", default="cuda:1")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    out = ctx.Queue()
    pd = ctx.Process(target=decode, args=(args, b))
    pp = ctx.Process(target=prefill, args=(args, a, out))
    pd.start()
    pp.start()
    results = out.get(timeout=600)
    pp.join(60)
    pd.join(60)
    meta = {"date": time.strftime("%Y-%m-%d"), "src": args.src, "dst": args.dst, "tokens": args.tokens,
            "command": " ".join(sys.argv)}
    print(json.dumps(meta))
    for r in results:
        print(f"{r['layout']:>12}: {r['blocks']} blocks, {r['bytes'] / 2**20:.0f} MiB, "
              f"{r['median_ms']} ms, {r['GB_per_s']} GB/s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
