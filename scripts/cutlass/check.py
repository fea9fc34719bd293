"""The CUTLASS GEMMs scripts/cutlass/build.sh makes, on the GPU: does each load, match torch, and keep
cuBLAS's pace at the prefill shapes (CUDA graphs)? Plain (three tilings) against `a @ w.T`; with RoPE on
adjacent column pairs against cuBLAS + rope.py's launch in pairs mode, and with k and v stored into a paged KV
cache by the epilogue against cuBLAS + rope.py's launch with the store; with SwiGLU on interleaved gate/up rows
against cuBLAS + the engine's SwiGLU launch. Prints cuBLAS's time over each one's (> 1: faster).

    python scripts/cutlass/check.py [--libs build/cutlass] [--only plain rope rope_kv swiglu]

(--only: some kinds, e.g. one a process, so a kernel's fault does not end the others' checks.)
"""

import argparse
import ctypes
import pathlib

import torch

from rlt.bench import floors
from rlt.kernels import rope
from rlt.kernels.activation import silu_mul
from rlt.models.layers import rope_inv_freq, split_qkv

D = 128
PLAIN = {
    "ouro q/k/v": (6144, 2048),
    "ouro o": (2048, 2048),
    "ouro [gate; up]": (11264, 2048),
    "ouro down": (2048, 5632),
    "nanbeige q/k/v": (8192, 3072),
    "nanbeige [gate; up]": (21504, 3072),
    "nanbeige down": (3072, 10752),
}
QKV = {"ouro": (16, 16, 2048), "nanbeige": (48, 8, 3072)}  # query heads, KV heads, hidden
MLP = {"ouro": (5632, 2048), "nanbeige": (10752, 3072)}  # intermediate, hidden


def load(path: pathlib.Path, entry: str, pointers: int, ints: int = 0, longs: int = 0):
    """An entry taking M, N, K, then pointers, ints and long longs, then the SM count and the stream."""
    fn = getattr(ctypes.CDLL(str(path)), entry)
    args = [ctypes.c_int] * 3 + [ctypes.c_void_p] * pointers + [ctypes.c_int] * ints
    fn.argtypes = args + [ctypes.c_longlong] * longs + [ctypes.c_int, ctypes.c_void_p]
    return fn


def rope_freq(hq: int, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each q/k/v column's frequency: a pair shares one, v's 0; inv_freq), on the GPU."""
    inv = rope_inv_freq(D, 10000.0)
    freq = torch.zeros((hq + 2 * hkv) * D)
    freq[: (hq + hkv) * D] = inv.repeat_interleave(2).repeat(hq + hkv)
    return freq.cuda(), inv.cuda()


def call(fn, *args):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert fn(*args, sms, torch.cuda.current_stream().cuda_stream) == 0


def randn(*shape, scale=1.0):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale


def report(name, fused, unfused, got, want):
    err = (got.float() - want.float()).abs().max().item()
    t_fused, t_unfused = floors.graph_us(fused), floors.graph_us(unfused)
    print(f"{name:34s} {t_fused:8.1f} us vs {t_unfused:8.1f}: {t_unfused / t_fused:.3f} (max diff {err:.3g})")


def check_plain(tilings: dict, name: str, m: int, n: int, k: int) -> None:
    a, w, d = randn(m, k), randn(n, k, scale=k**-0.5), randn(m, n)
    want = a @ w.t()
    for tiling, fn in tilings.items():

        def gemm(fn=fn):
            call(fn, m, n, k, a.data_ptr(), w.data_ptr(), d.data_ptr())

        gemm()
        report(f"{name} {m}{tiling}", gemm, lambda: a @ w.t(), d, want)


def check_rope(fn, name: str, m: int, hq: int, hkv: int, k: int) -> None:
    n, (freq, inv) = (hq + 2 * hkv) * D, rope_freq(hq, hkv)
    a, w, d = randn(m, k), randn(n, k, scale=k**-0.5), randn(m, n)
    pos = torch.arange(m, device="cuda")

    def fused():
        call(fn, m, n, k, a.data_ptr(), w.data_ptr(), d.data_ptr(), freq.data_ptr(), pos.data_ptr())

    def unfused():
        y = a @ w.t()
        rope.rope_(*split_qkv(y, hq, hkv, D)[:2], pos, inv, True)
        return y

    fused()
    report(f"{name} q/k/v + RoPE {m}", fused, unfused, d, unfused())


def check_rope_kv(fns, name: str, m: int, hq: int, hkv: int, k: int) -> None:
    """fns: (q alone, D) entries; k and v into a paged cache at scattered slots either way."""
    n, bs, layer = (hq + 2 * hkv) * D, 16, 1
    freq, inv = rope_freq(hq, hkv)
    a, w = randn(m, k), randn(n, k, scale=k**-0.5)
    pos = torch.arange(m, device="cuda")
    blocks = -(-m // bs) + 3
    slots = torch.randperm(blocks * bs, device="cuda")[:m]  # (scattered, as a paged pool's)
    cache, want_cache = (torch.zeros(blocks, 2, 2, bs, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in "ab")
    out = {"q": torch.empty(m, hq * D, device="cuda", dtype=torch.bfloat16), "D": randn(m, n)}
    at, strides = cache[:, layer].data_ptr(), (cache.stride(0), cache.stride(3), cache.stride(2))

    def unfused():
        y = a @ w.t()
        rope.rope_write_kv(*split_qkv(y, hq, hkv, D), pos, inv, True, want_cache, layer, slots, bs)
        return y

    want = unfused()
    for (kind, o), fn in zip(out.items(), fns):

        def fused(fn=fn, o=o):
            ptrs = (a.data_ptr(), w.data_ptr(), o.data_ptr(), at, slots.data_ptr(), freq.data_ptr(), pos.data_ptr())
            call(fn, m, n, k, *ptrs, hq * D, bs, *strides)

        cache.zero_()
        fused()
        got, ref = o.flatten(), (want[:, : hq * D] if kind == "q" else want).flatten()
        report(
            f"{name} q/k/v + RoPE + KV ({kind}) {m}",
            fused,
            unfused,
            torch.cat([got, cache.flatten()]),
            torch.cat([ref, want_cache.flatten()]),
        )


def check_swiglu(fn, name: str, m: int, inter: int, k: int) -> None:
    a, gate_up, out = randn(m, k), randn(2 * inter, k, scale=k**-0.5), randn(m, inter)
    pairs = torch.stack([gate_up[:inter], gate_up[inter:]], 1).reshape(2 * inter, k).contiguous()  # g0 u0 g1 u1 ..

    def fused():
        call(fn, m, 2 * inter, k, a.data_ptr(), pairs.data_ptr(), out.data_ptr())

    def unfused():
        return silu_mul(a @ gate_up.t())

    fused()
    report(f"{name} [gate; up] + SwiGLU {m}", fused, unfused, out, unfused())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", default="build/cutlass")
    ap.add_argument("--only", nargs="*", default=["plain", "rope", "rope_kv", "swiglu"])
    args = ap.parse_args()
    libs, only = pathlib.Path(args.libs), set(args.only)
    fused = ("libgemm_rope", "libgemm_rope_kv", "libgemm_swiglu")
    tilings = [p for p in sorted(libs.glob("libgemm*.so")) if p.stem not in fused]
    plain = {p.stem[len("libgemm") :] or "_coop128x128": load(p, "rlt_gemm", 3) for p in tilings}
    rope_fn = load(libs / "libgemm_rope.so", "rlt_gemm_rope", 5)
    swiglu_fn = load(libs / "libgemm_swiglu.so", "rlt_gemm_swiglu", 3)
    rope_kv_fns = [load(libs / "libgemm_rope_kv.so", e, 7, 2, 3) for e in ("rlt_gemm_rope_kv", "rlt_gemm_rope_d_kv")]
    for m in (1024, 4096):
        for name, (n, k) in PLAIN.items() if "plain" in only else ():
            check_plain(plain, name, m, n, k)
        for name, (hq, hkv, k) in QKV.items():
            if "rope" in only:
                check_rope(rope_fn, name, m, hq, hkv, k)
            if "rope_kv" in only:
                check_rope_kv(rope_kv_fns, name, m, hq, hkv, k)
        for name, (inter, k) in MLP.items() if "swiglu" in only else ():
            check_swiglu(swiglu_fn, name, m, inter, k)


if __name__ == "__main__":
    main()
