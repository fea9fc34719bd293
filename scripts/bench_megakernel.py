"""Can one persistent launch run a decode loop step at one row faster than launched kernels? Three
chains at Ouro-1.4B's shapes (24 layers), each run by scripts/megakernel_chain.cu (a producer warp a
block streams the block's share of the weights and cached keys into a shared-memory ring whatever
the chain; consumer warps wait on the previous stage's completion counter, not a grid barrier) and
by the engine's launches (rlt/kernels: one-row GEMVs with PDL, add + RMSNorm, the SwiGLU epilogue,
the split decode attention and its merge):

- products: q/k/v, o, [gate; up], down a layer, each product's input the previous one's output;
- layers: the same with the engine's add + RMSNorm (Ouro's sandwich) before [gate; up] and the
  next q/k/v, SwiGLU before down;
- step: with the decode attention at the last of 1,024 positions between q/k/v and o: q and the new
  key rotated (RoPE), the new key and value stored, the others cached.

Prints each chain's time, its bytes (weights, cached keys) over the measured copy rate (of roof),
and its result's largest difference from the engine's, relative to that result's largest value;
with no waits, the persistent kernel's time is its byte stream's alone (its results are wrong).

    python scripts/bench_megakernel.py [--layers 24] [--configs 6x32768x8 12x16384x8]

Needs torch.cuda._compile_kernel (NVRTC; torch >= 2.8) and an sm_90 GPU. A hang (a wait that is
never met) ends the process --watchdog seconds after the chain's start, with each stage's completed chunks (read by a
copy on another stream while the kernel still runs) against its count: the first short one is where
the chain stopped.
"""

import argparse
import ctypes
import os
import pathlib
import tempfile
import threading

import torch

from rlt.bench import floors
from rlt.kernels import gemv, norm, rope
from rlt.kernels.decode_attention import decode_attention
from rlt.models.layers import rope_inv_freq

SOURCE = pathlib.Path(__file__).with_name("megakernel_chain.cu")
GEMV, ATTN, MERGE = range(3)  # (as the .cu file)
PLAIN, ADD_NORM, SWIGLU = range(3)
MAXV, D, BLOCK = 4, 128, 16  # (the .cu file's x vectors a lane and head dimension; the engine's block size)


def build(stages: int, stage_bytes: int, cw: int):
    """The kernel for these macros, and its dynamic shared memory in bytes."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:  # (no CUDA toolkit to take include paths from: the source needs none)
        cpp_extension.CUDA_HOME = tempfile.mkdtemp()
    src = f"#define STAGES {stages}\n#define STAGE_BYTES {stage_bytes}\n#define CW {cw}\n" + SOURCE.read_text()
    try:
        kernel = torch.cuda._compile_kernel(src, "chain")
    except OSError:  # NVRTC not on the loader's path: the one torch's wheel brought
        for lib in sorted(pathlib.Path(torch.__file__).parents[1].glob("nvidia/**/libnvrtc.so*")):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        kernel = torch.cuda._compile_kernel(src, "chain")
    smem = stages * stage_bytes + (2 * 64 * cw + 32 + 2048 + 128 + cw * 32) * 4 + 2 * stages * 8
    if hasattr(kernel, "set_shared_memory_config"):
        kernel.set_shared_memory_config(smem)
    else:  # (older torch: the driver's attribute directly; 8 = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        assert ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(kernel.func, 8, smem) == 0
    return kernel, smem


class Model:
    """Random weights and a cache at Ouro-1.4B's shapes; the activation buffer the chains share."""

    def __init__(self, layers: int, ctx: int, hidden=2048, inter=5632, heads=16):
        torch.manual_seed(0)
        self.layers, self.ctx, self.hidden, self.inter, self.heads = layers, ctx, hidden, inter, heads
        dims = [(3 * heads * D, hidden), (hidden, heads * D), (2 * inter, hidden), (hidden, inter)]
        rand = lambda n, k: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5  # noqa: E731
        self.ws = [[rand(n, k) for n, k in dims] for _ in range(layers)]
        self.kv = torch.randn(layers, 2, heads, ctx, D, device="cuda", dtype=torch.bfloat16)  # (contiguous)
        # the same keys for the engine's paged kernel: [blocks, layers, 2, block, heads, D], blocks in order
        self.cache = self.kv.view(layers, 2, heads, ctx // BLOCK, BLOCK, D).permute(3, 0, 1, 4, 2, 5).contiguous()
        self.table = torch.arange(ctx // BLOCK, device="cuda", dtype=torch.int32)[None]
        self.pos = torch.tensor([ctx - 1], device="cuda", dtype=torch.int32)  # (the new key's; slot = position)
        self.inv_freq = rope_inv_freq(D, 10000.0).cuda()
        self.x0 = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        self.res0 = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        self.wa, self.wo = (1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        self.eps = 1e-6

    def launched(self, chain: str):
        """The engine's launches for a chain -> its last product's output [N]."""
        x, res = self.x0[None], self.res0[None]
        for layer, (qkv, o, gate_up, down) in enumerate(self.ws):
            q = gemv.gemv(x, qkv)
            if chain == "step":  # (as the engine's unfused path: RoPE + the K/V store, then the attention)
                q, k, v = (t.view(1, self.heads, D) for t in q.split(self.heads * D, dim=1))
                rope.rope_write_kv(q, k, v, self.pos, self.inv_freq, False, self.cache, layer, self.pos.long(), BLOCK)
                q = decode_attention(self.cache, layer, q, self.table, self.pos, BLOCK)
            q = q.reshape(1, -1)[:, : o.shape[1]]
            y = gemv.gemv(q, o, early_tiles=gemv.NORMED_EARLY_TILES)
            if chain == "products":
                x = d = gemv.gemv(gemv.gemv(y, gate_up)[:, : down.shape[1]], down)
                continue
            res, x = norm.add_rms_norm(res, y, self.wa, self.wo, self.eps)
            d = gemv.gemv(gemv.gemv_swiglu(x, gate_up), down, early_tiles=gemv.NORMED_EARLY_TILES)
            res, x = norm.add_rms_norm(res, d, self.wa, self.wo, self.eps)
        return d[0]

    def stages(self, chain: str, stage_bytes: int) -> tuple[list[dict], list[int]]:
        """The persistent kernel's stages of a chain (their inputs and outputs in act; a chunk: a
        slot's worth of GEMV rows, or a head's slice of keys), and each stage's chunks."""
        out, st, norms = [self.hidden], [], iter(range(1 << 20))  # (act[:hidden] holds x0)

        def add(kind, n, k, rows, src, role=PLAIN, size=None, read=None):
            at = out[-1] + (-out[-1] % 8)  # (16-byte aligned)
            t = next(norms) if role == ADD_NORM else 0
            st.append(dict(kind=kind, role=role, t=t, n=n, k=k, rows=rows, src=src, inp=read, out=at))
            out.append(at + (size or n))
            return at

        x = 0
        for layer, (qkv, o, gate_up, down) in enumerate(self.ws):
            role = ADD_NORM if layer and chain != "products" else PLAIN
            y = add(GEMV, *qkv.shape, None, qkv.data_ptr(), role, read=x)
            if chain == "step":
                y = add(ATTN, self.heads, self.ctx, None, self.kv[layer].data_ptr(), size=0, read=y)
                y = add(MERGE, self.heads, None, 1, 0, size=self.heads * D, read=y)
            y = add(GEMV, *o.shape, None, o.data_ptr(), read=y)
            g = add(GEMV, *gate_up.shape, None, gate_up.data_ptr(), PLAIN if chain == "products" else ADD_NORM, read=y)
            x = add(GEMV, *down.shape, None, down.data_ptr(), PLAIN if chain == "products" else SWIGLU, read=g)
        keys = 1 << (min(128, stage_bytes // (4 * D)).bit_length() - 1)  # an attention item's (dividing ctx)
        for s in st:
            s["rows"] = max(1, stage_bytes // (2 * s["k"])) if s["kind"] == GEMV else s["rows"] or keys
            if s["kind"] == MERGE:
                s["k"] = self.ctx // keys  # (its slices a head)
        counts = [s["n"] * self.ctx // s["rows"] if s["kind"] == ATTN else -(-s["n"] // s["rows"]) for s in st]
        # the .cu file's fixed sizes: a GEMV chunk's sums (64 rows), an item's keys (R_MAX), q (Q_MAX)
        assert all(s["rows"] <= 64 for s in st if s["kind"] == GEMV), "GEMV rows a chunk over 64"
        assert keys <= 128 and self.ctx % keys == 0 and self.heads * D <= 2048, (keys, self.ctx, self.heads)
        return st, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--configs", nargs="*", default=["6x32768x8", "12x16384x8", "4x49152x8", "6x32768x12"])
    ap.add_argument("--chains", nargs="*", default=["products", "layers", "step"])
    ap.add_argument("--watchdog", type=float, default=60)
    args = ap.parse_args()
    running = {}  # the launch in flight: its done counters, their pinned copy, each stage's chunks

    def hung():
        print("watchdog: hung", flush=True)
        threading.Timer(10, lambda: os._exit(3)).start()  # (should the readout wait on the GPU too)
        if running:
            with torch.cuda.stream(running["side"]):
                running["host"].copy_(running["done"], non_blocking=True)
            running["side"].synchronize()
            done = running["host"].tolist()
            print("chunks done / of, by stage:", " ".join(f"{d}/{c}" for d, c in zip(done, running["counts"])))
        os._exit(3)

    def arm():  # (restarted before each build and chain: a slow compile or chain is not a hang)
        if "timer" in running:
            running["timer"].cancel()
        running["timer"] = threading.Timer(args.watchdog, hung)
        running["timer"].daemon = True
        running["timer"].start()

    arm()
    m = Model(args.layers, args.ctx)
    rate = floors.ceilings("cuda")["copy_gbps"] * 1e9
    weight_bytes = sum(w.numel() * 2 for ws in m.ws for w in ws)
    chains = {"products": weight_bytes, "layers": weight_bytes, "step": weight_bytes + m.kv.numel() * 2}
    chains = {c: chains[c] for c in args.chains}
    print(f"{args.layers} layers, {args.ctx} cached keys, copy rate {rate / 1e12:.2f} TB/s")
    print(f"{'chain':<80} {'us':>8} {'GB':>6} {'of roof':>8} {'rel. diff':>9}", flush=True)

    def row(name, t, nbytes, err):  # (printed as measured: a hang loses only the rest)
        print(f"{name:<80} {t:>8.1f} {nbytes / 1e9:>6.3f} {nbytes / rate * 1e6 / t:>8.3f} {err:>9.1e}", flush=True)

    refs = {c: m.launched(c).float() for c in chains}
    for c, b in chains.items():
        row(f"launched, {c}", floors.graph_us(lambda c=c: m.launched(c)), b, 0.0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    act = torch.zeros(1 << 22, device="cuda", dtype=torch.bfloat16)
    act[: m.hidden] = m.x0
    fpart = torch.zeros(m.heads * args.ctx * (D + 2), device="cuda", dtype=torch.float32)
    resid = torch.empty(2, m.hidden, device="cuda", dtype=torch.bfloat16)
    for cfg in args.configs:
        stages, stage_bytes, cw = map(int, cfg.split("x"))
        if -(-m.inter // 8 // cw) > 32 * MAXV or cw * 32 % D:
            print(f"{cfg}: skipped (a warp's slice of x over {32 * MAXV} vectors, or warps not a multiple of D)")
            continue
        arm()
        kernel, smem = build(stages, stage_bytes, cw)
        for chain, nbytes in chains.items():
            st, counts = m.stages(chain, stage_bytes)

            def col(key, dtype=torch.int32, st=st):
                return torch.tensor([s[key] or 0 for s in st], device="cuda", dtype=dtype)

            first = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
            tables = [col("src", torch.int64), col("kind"), col("role"), col("t"), col("n"), col("k"), col("rows")]
            tables += [first, col("inp", torch.int64), col("out", torch.int64)]
            end = st[-1]["out"]

            done = torch.zeros(len(st), device="cuda", dtype=torch.int32)
            arm()
            running.update(done=done, counts=counts, side=torch.cuda.Stream())
            running["host"] = torch.empty(len(st), dtype=torch.int32, pin_memory=True)

            def run(wait, kernel=kernel, smem=smem, cw=cw, tables=tables, done=done):
                done.zero_()
                resid[0].copy_(m.res0)
                args_ = [*tables, act, fpart, done, len(done), wait, resid, m.wa, m.wo, m.eps, m.hidden, m.inter]
                args_ += [m.inv_freq, args.ctx - 1]
                kernel(grid=(sms, 1, 1), block=((cw + 1) * 32, 1, 1), args=args_, shared_mem=smem)

            for wait in (0, 1) if chain == "products" else (1,):
                act[m.hidden :].zero_()
                run(wait)
                torch.cuda.synchronize()
                ref = refs[chain]
                got = act[end : end + len(ref)].float()
                err = (got - ref).abs().max().item() / ref.abs().max().item()
                name = f"persistent {cfg} (stages x bytes x consumer warps), {chain}{'' if wait else ', no waits'}"
                row(name, floors.graph_us(lambda w=wait, r=run: r(w)), nbytes, err)
    running["timer"].cancel()


if __name__ == "__main__":
    main()
