"""Can one persistent launch stream a loop step's one-row products faster than launched GEMVs?
The chain of scripts/bench_persistent.py (Ouro-1.4B's 96 products: q/k/v, o, [gate; up], down per
layer, each product's input the previous one's output) run by scripts/megakernel_chain.cu: a
producer warp per block streams the block's weight rows into a shared-memory ring (1-D bulk copies)
regardless of the chain, consumer warps wait on the previous product's completion counter (not a
grid barrier) and multiply rows already on chip. Against the engine's launched GEMV chain (PDL) and
the same kernel with no waits (the weight stream alone: its sums are wrong, its time is the
stream's ceiling); then with the engine's layer ops between the products (Ouro's add + RMSNorm
before [gate; up] and the next q/k/v, SwiGLU before down; attention left out) against the engine's
launches for them. Each as a share of the chain's bytes over the measured copy rate.

    python scripts/bench_megakernel.py [--layers 24] [--configs 6x32768x8 12x16384x8]

Needs torch.cuda._compile_kernel (NVRTC; torch >= 2.8) and an sm_90 GPU. A hang (a wait that is
never met) ends the process after --watchdog seconds.
"""

import argparse
import ctypes
import os
import pathlib
import tempfile
import threading

import torch

from rlt.bench import floors
from rlt.kernels import gemv, norm

SOURCE = pathlib.Path(__file__).with_name("megakernel_chain.cu")
MAXV = 4  # (as the .cu file: 16-byte vectors of x a lane holds)


def shapes(hidden=2048, inter=5632, qkv=6144, layers=24):
    """(N, K) of each product of a loop step, in order (scripts/bench_persistent.py's)."""
    return [(qkv, hidden), (hidden, qkv // 3), (2 * inter, hidden), (hidden, inter)] * layers


def build(stages: int, stage_bytes: int, cw: int):
    src = f"#define STAGES {stages}\n#define STAGE_BYTES {stage_bytes}\n#define CW {cw}\n" + SOURCE.read_text()
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:  # (no CUDA toolkit to take include paths from: the source needs none)
        cpp_extension.CUDA_HOME = tempfile.mkdtemp()
    try:
        kernel = torch.cuda._compile_kernel(src, "chain")
    except OSError:  # NVRTC not on the loader's path: the one torch's wheel brought
        for lib in sorted(pathlib.Path(torch.__file__).parents[1].glob("nvidia/**/libnvrtc.so*")):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        kernel = torch.cuda._compile_kernel(src, "chain")
    smem = stages * stage_bytes + 2 * 64 * cw * 4 + 32 * 4 + 2 * stages * 8
    if hasattr(kernel, "set_shared_memory_config"):
        kernel.set_shared_memory_config(smem)
    else:  # (older torch: the driver's attribute directly; 8 = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        assert ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(kernel.func, 8, smem) == 0
    return kernel, smem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--configs", nargs="*", default=["6x32768x8", "12x16384x8", "4x49152x8", "6x32768x12"])
    ap.add_argument("--watchdog", type=float, default=60)
    args = ap.parse_args()
    timer = threading.Timer(args.watchdog, lambda: (print("watchdog: hung", flush=True), os._exit(3)))
    timer.daemon = True
    timer.start()
    torch.manual_seed(0)
    dims = shapes(layers=args.layers)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for n, k in dims]
    width = max(max(n, k) for n, k in dims)
    buf = torch.zeros(len(dims) + 1, width, device="cuda", dtype=torch.bfloat16)
    buf[0].normal_()
    nbytes = sum(w.numel() * 2 for w in ws)
    rate = floors.ceilings("cuda")["copy_gbps"] * 1e9
    floor_us = nbytes / rate * 1e6

    def launched():  # the engine's one-row GEMV, one launch a product (PDL)
        x = buf[0:1, : dims[0][1]]
        for w, (n, k) in zip(ws, dims):
            x = gemv.gemv(x[:, :k], w)
        return x

    hidden, inter, eps = dims[1][0], dims[3][1], 1e-6
    res0 = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    wa, wo = (1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    resid = torch.empty(2, hidden, device="cuda", dtype=torch.bfloat16)

    def launched_layers():  # the engine's launches for the same products and layer ops (no attention)
        x, res = buf[0:1, :hidden], res0[None]
        for qkv, o, gate_up, down in zip(*[iter(ws)] * 4):
            q = gemv.gemv(x, qkv, early_tiles=1)[:, : o.shape[1]]
            res, x = norm.add_rms_norm(res, gemv.gemv(q, o, early_tiles=gemv.NORMED_EARLY_TILES), wa, wo, eps)
            d = gemv.gemv(gemv.gemv_swiglu(x, gate_up), down, early_tiles=gemv.NORMED_EARLY_TILES)
            res, x = norm.add_rms_norm(res, d, wa, wo, eps)
        return d

    refs = {0: launched()[0].float(), 1: launched_layers()[0].float()}
    rows = [
        ("launched GEMVs (PDL)", floors.graph_us(launched), 0.0),
        ("launched as the engine: + add + RMSNorm launches, SwiGLU epilogue", floors.graph_us(launched_layers), 0.0),
    ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weights = torch.tensor([w.data_ptr() for w in ws], device="cuda", dtype=torch.int64)
    n_of = torch.tensor([n for n, _ in dims], device="cuda", dtype=torch.int32)
    k_of = torch.tensor([k for _, k in dims], device="cuda", dtype=torch.int32)
    done = torch.zeros(len(dims), device="cuda", dtype=torch.int32)
    for cfg in args.configs:
        stages, stage_bytes, cw = map(int, cfg.split("x"))
        if any(-(-k // 8 // cw) > 32 * MAXV for _, k in dims):
            print(f"{cfg}: skipped, a warp's slice of x is over {32 * MAXV} vectors")
            continue
        kernel, smem = build(stages, stage_bytes, cw)
        per = [max(1, stage_bytes // (2 * k)) for _, k in dims]
        counts = [-(-n // r) for (n, _), r in zip(dims, per)]
        first = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), device="cuda", dtype=torch.int32)
        rows_of = torch.tensor(per, device="cuda", dtype=torch.int32)

        def run(wait, layer_ops, kernel=kernel, smem=smem, cw=cw, first=first, rows_of=rows_of):
            done.zero_()
            resid[0].copy_(res0)
            args = [weights, n_of, k_of, rows_of, first, buf, buf.stride(0), done, len(dims), wait, layer_ops]
            args += [resid, wa, wo, eps, hidden, inter]
            kernel(grid=(sms, 1, 1), block=((cw + 1) * 32, 1, 1), args=args, shared_mem=smem)

        for wait, layer_ops in ((0, 0), (1, 0), (1, 1)):
            buf[1:].zero_()
            run(wait, layer_ops)
            torch.cuda.synchronize()
            got, ref = buf[len(dims), : dims[-1][0]].float(), refs[layer_ops]
            err = (got - ref).abs().max().item() / ref.abs().max().item()
            what = ", no waits" if not wait else ", + layer ops" if layer_ops else ""
            name = f"persistent {cfg} (stages x bytes x consumer warps){what}"
            rows.append((name, floors.graph_us(lambda w=wait, lo=layer_ops: run(w, lo)), err))
    timer.cancel()
    print(f"{len(dims)} products, {nbytes / 1e9:.3f} GB, copy rate {rate / 1e12:.2f} TB/s, floor {floor_us:.1f} us")
    print(f"{'variant':<64} {'us/chain':>9} {'of roof':>8} {'rel. diff':>9}")
    for name, t, err in rows:
        print(f"{name:<64} {t:>9.1f} {floor_us / t:>8.3f} {err:>9.1e}")


if __name__ == "__main__":
    main()
