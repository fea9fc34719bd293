"""KV handoff bandwidth: one prompt's KV blocks written by NIXL from a "prefill" process's pool into
a "decode" process's pool, through rlt's own KVTransport (the path PD uses).

Two layouts: the blocks consecutive on both sides (runs merge into one descriptor per plane) and
scattered (one descriptor per block). The received bytes are checked against the sent ones.
`rlt bench kv-handoff` runs it (NIXL and, by default, two GPUs).
"""

import multiprocessing as mp
import time
from dataclasses import dataclass


@dataclass
class Handoff:
    """The pools' geometry (defaults: Nanbeige4.2-3B, bf16, 16-position blocks: a 4096-token prompt
    is 512 blocks of 1.375 MiB = 704 MiB) and the two devices."""

    tokens: int = 4096
    layers: int = 22
    kv_heads: int = 8
    head_dim: int = 128
    planes: int = 2
    block_size: int = 16
    num_blocks: int = 1200
    src: str = "cuda:0"
    dst: str = "cuda:1"
    iters: int = 5


def _pool(h: Handoff, device: str):
    import torch

    shape = (h.num_blocks, h.layers, 2, h.block_size, h.kv_heads, h.head_dim)
    return torch.zeros(shape, dtype=torch.bfloat16, device=device)


def _decode(h: Handoff, conn) -> None:
    import torch

    from rlt.workers.kv_transfer import KVTransport

    if h.dst.startswith("cuda"):
        torch.cuda.set_device(h.dst)
    cache = _pool(h, h.dst)
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


def _prefill(h: Handoff, conn, out) -> None:
    import torch

    from rlt.workers.kv_transfer import KVTransport, wait_done

    if h.src.startswith("cuda"):
        torch.cuda.set_device(h.src)
    cache = _pool(h, h.src)
    cache.normal_()
    t = KVTransport("prefill", cache)
    peer = conn.recv()
    t.add_peer(peer)
    per_plane = -(-h.tokens // h.block_size)
    n = per_plane * h.planes
    g = torch.Generator().manual_seed(0)
    layouts = {
        "consecutive": (list(range(n)), list(range(n))),
        "scattered": (
            torch.randperm(h.num_blocks, generator=g)[:n].tolist(),
            torch.randperm(h.num_blocks, generator=g)[:n].tolist(),
        ),
    }
    nbytes = n * t.block_bytes
    results = []
    for name, (src, dst) in layouts.items():
        times = []
        for it in range(h.iters + 1):
            conn.send((dst, float(cache[src].float().sum())))
            if h.src.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            handle = t.write("decode", src, dst, f"{it}:0".encode())
            wait_done(t, handle, 60)
            dt = time.perf_counter() - t0
            t.release(handle)
            got, expect = conn.recv()
            assert abs(got - expect) <= 1e-3 * max(1.0, abs(expect)), (name, got, expect)
            if it:
                times.append(dt)
        times.sort()
        med = times[len(times) // 2]
        results.append(
            {
                "layout": name,
                "blocks": n,
                "bytes": nbytes,
                "median_ms": round(med * 1e3, 3),
                "GB_per_s": round(nbytes / med / 1e9, 1),
                "checked": True,
            }
        )
    conn.send(None)
    out.put(results)
    t.close()


def measure(h: Handoff, timeout: float = 600) -> list[dict]:
    """Per layout: blocks, bytes, median ms of `iters` writes (after one warm-up) and GB/s."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    out = ctx.Queue()
    pd = ctx.Process(target=_decode, args=(h, b))
    pp = ctx.Process(target=_prefill, args=(h, a, out))
    pd.start()
    pp.start()
    results = out.get(timeout=timeout)
    pp.join(60)
    pd.join(60)
    return results


def command(args) -> None:
    """`rlt bench kv-handoff` (the parser: rlt/bench/cli.py): the geometry's fields as options."""
    import dataclasses
    import json
    import sys

    h = Handoff(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Handoff)})
    results = measure(h)
    meta = {"date": time.strftime("%Y-%m-%d"), "src": h.src, "dst": h.dst, "tokens": h.tokens}
    meta["command"] = " ".join(sys.argv)
    print(json.dumps(meta))
    for r in results:
        print(
            f"{r['layout']:>12}: {r['blocks']} blocks, {r['bytes'] / 2**20:.0f} MiB, "
            f"{r['median_ms']} ms, {r['GB_per_s']} GB/s"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
