"""One-row GEMM (GEMV) in Triton, for decode passes of one row: y = x @ w.T with x [1, K].

Such a pass reads every weight once and does little else, so its speed is these products' share
of HBM bandwidth. cuBLAS serves most shapes well at M = 1 but not all (a 2048 x 2048 projection
runs split-K at a fraction of the bandwidth), so the first call per weight shape times cuBLAS and
each config here with the L2 flushed before every call (weights come from HBM in a real pass,
never from L2) and keeps the fastest; during a CUDA-graph capture an undecided shape uses cuBLAS.

The GEMV can also compute its input row itself (a prologue), saving the launch that would make it
(at one row a launch costs about as much as a small kernel's work): SwiGLU of the [gate; up]
projection (the down projection), or the residual add and RMSNorm before a projection. Each program
recomputes the row from the previous kernel's outputs, rounding as the separate kernels do.
"""

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.norm import rstd, scale

# (rows of w per program, K per load, warps): few wide loads per program keep many bytes in flight.
# (The leaders of scripts/tune_decode.py's isolated timings, tried at 6c10aee, ran 4 % slower in the
# engine than this set, whose pick was 2 x 1024 / 4 warps for every Ouro shape.)
CONFIGS = ((2, 1024, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4))

# Prologues: how a program gets its input row x.
PLAIN, SWIGLU, NORM, ADD_NORM, NORMED_ADD_NORM = range(5)
# PLAIN: x as given. SWIGLU: x = silu(gate) * up of the [gate; up] row given (2K wide).
# NORM: x = rms_norm(r, w_out). ADD_NORM: r' = r + a, x = rms_norm(r', w_out).
# NORMED_ADD_NORM: r' = r + rms_norm(a, w_a), x = rms_norm(r', w_out). r' is stored (program 0).
_SWIGLU, _NORM, _ADD_NORM, _NORMED_ADD_NORM = (tl.constexpr(p) for p in range(1, 5))  # the same, for kernels
fused = os.environ.get("RLT_FUSED_GEMV", "1") != "0"  # 0: separate launches (A/B measurements)
# RLT_GEMV_CONFIG=2,1024,4: that config for every shape instead of timing (A/B measurements)
forced = tuple(map(int, os.environ["RLT_GEMV_CONFIG"].split(","))) if os.environ.get("RLT_GEMV_CONFIG") else None


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, a_ptr, wa_ptr, wo_ptr, ro_ptr, eps, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr, ROW: tl.constexpr, PDL: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    dt = y_ptr.dtype.element_ty
    # The first weight tile is read before waiting on the previous kernel (with PDL its reads overlap
    # that kernel's tail): weights are never written during a pass. Activations only after the wait.
    w = tl.load(rows + offs_k[None, :], mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    pdl.begin(PDL)
    r_a = 1.0
    r_x = 1.0
    if PROLOGUE >= _NORM:  # the row's rstd (and the new residual) from the whole row first
        offs_r = tl.arange(0, ROW)
        r_ok = offs_r < K
        xr = tl.load(x_ptr + offs_r, mask=r_ok, other=0.0)
        if PROLOGUE >= _ADD_NORM:
            ar = tl.load(a_ptr + offs_r, mask=r_ok, other=0.0)
            if PROLOGUE == _NORMED_ADD_NORM:
                r_a = rstd(ar.to(tl.float32), K, eps)
                ar = scale(ar.to(tl.float32), r_a, tl.load(wa_ptr + offs_r, mask=r_ok, other=0.0), dt)
            xr = (xr.to(tl.float32) + ar.to(tl.float32)).to(dt)
            if tl.program_id(0) == 0:
                tl.store(ro_ptr + offs_r, xr, mask=r_ok)
        r_x = rstd(xr.to(tl.float32), K, eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        if k0 > 0:
            w = tl.load(rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if PROLOGUE == _SWIGLU:
            g = tl.load(x_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + K + kk, mask=k_ok, other=0.0).to(tl.float32)
            x = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u).to(dt)
        else:
            x = tl.load(x_ptr + kk, mask=k_ok, other=0.0)
        if PROLOGUE >= _NORM:
            if PROLOGUE >= _ADD_NORM:
                a = tl.load(a_ptr + kk, mask=k_ok, other=0.0)
                if PROLOGUE == _NORMED_ADD_NORM:
                    a = scale(a.to(tl.float32), r_a, tl.load(wa_ptr + kk, mask=k_ok, other=0.0), dt)
                x = (x.to(tl.float32) + a.to(tl.float32)).to(dt)
            x = scale(x.to(tl.float32), r_x, tl.load(wo_ptr + kk, mask=k_ok, other=0.0), dt)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + offs_n, tl.sum(acc, axis=1).to(dt), mask=n_ok)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int], prologue: int = PLAIN,
         a: torch.Tensor | None = None, weight_a: torch.Tensor | None = None, weight_out: torch.Tensor | None = None,
         eps: float = 0.0, residual_out: torch.Tensor | None = None) -> torch.Tensor:
    """x [1, K] (contiguous; [1, 2K] for SWIGLU), w [N, K] (rows contiguous) -> [1, N] in x's dtype.
    The norm prologues take the residual row as x, a the row added to it, the norm weights, eps and
    residual_out [1, K] for the new residual (ADD_NORM and NORMED_ADD_NORM)."""
    N, K = w.shape
    bn, bk, warps = config
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    pdl.launch(_gemv_kernel, (triton.cdiv(N, bn),), x, w, y, N, K, w.stride(0), x if a is None else a,
               x if weight_a is None else weight_a, x if weight_out is None else weight_out,
               y if residual_out is None else residual_out, eps, BLOCK_N=bn, BLOCK_K=bk, PROLOGUE=prologue,
               ROW=triton.next_power_of_2(K) if prologue >= NORM else 1, num_warps=warps, like=x)
    return y


_choice: dict[tuple, tuple | None] = {}  # (w.shape, dtype, device, prologue) -> fastest config; None: cuBLAS


def _pick(w: torch.Tensor, prologue: int, *args) -> tuple | None:
    """The fastest config for this call (cuBLAS too for a plain product), each timed with the L2
    flushed before every call, in three interleaved rounds keeping each one's best: a single
    timing can catch the GPU's clocks ramping up or other work, and a pick lasts the process."""
    from triton.testing import do_bench

    if forced is not None:
        return forced

    def call(cfg):
        if cfg is None:
            return lambda: F.linear(args[0], w)
        return lambda: gemv(args[0], w, cfg, prologue, *args[1:])

    best = dict.fromkeys(([None] if prologue == PLAIN else []) + list(CONFIGS), float("inf"))
    for _ in range(3):
        for cfg in best:
            best[cfg] = min(best[cfg], do_bench(call(cfg), warmup=2, rep=10, return_mode="median"))
    return min(best, key=best.get)


def _decided(key: tuple, w: torch.Tensor, prologue: int, *args) -> bool:
    """Whether _choice[key] is known, picking it now unless a CUDA graph is being captured."""
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return False
        _choice[key] = _pick(w, prologue, *args)
    return True


def linear_one_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w.T by the faster of cuBLAS and the Triton GEMV for this weight shape (cuBLAS while
    a CUDA graph captures an undecided shape)."""
    key = (tuple(w.shape), w.dtype, w.device, PLAIN)
    x = x.contiguous()
    if not _decided(key, w, PLAIN, x):
        return F.linear(x, w)
    cfg = _choice[key]
    return F.linear(x, w) if cfg is None else gemv(x, w, cfg)


def fused_one_row(x: torch.Tensor, w: torch.Tensor, prologue: int, a: torch.Tensor | None = None,
                  weight_a: torch.Tensor | None = None, weight_out: torch.Tensor | None = None, eps: float = 0.0,
                  residual_out: torch.Tensor | None = None) -> torch.Tensor | None:
    """gemv with a prologue (arguments as gemv's), its config picked per (shape, prologue); None
    where the plain product of this shape runs on cuBLAS, a CUDA graph captures an undecided shape,
    or RLT_FUSED_GEMV=0: the caller then makes the input row with its own launch."""
    plain = (tuple(w.shape), w.dtype, w.device, PLAIN)
    K = w.shape[1]
    if not fused or not _decided(plain, w, PLAIN, x[:, :K].contiguous()) or _choice[plain] is None:
        return None
    key = plain[:3] + (prologue,)
    scratch = None if residual_out is None else torch.empty_like(residual_out)
    if not _decided(key, w, prologue, x, a, weight_a, weight_out, eps, scratch):
        return None
    return gemv(x, w, _choice[key], prologue, a, weight_a, weight_out, eps, residual_out)


def choices() -> dict[str, str]:
    """What the picker chose per shape and prologue (for benchmark logs)."""
    names = ("", "+swiglu", "+norm", "+add_norm", "+normed_add_norm")
    return {"x".join(map(str, k[0])) + names[k[3]]: "cublas" if c is None else "triton %dx%d/%dw" % c
            for k, c in _choice.items()}
