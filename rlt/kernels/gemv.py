"""One-row GEMM (GEMV) in Triton, for decode passes of one row: y = x @ w.T with x [1, K].

Such a pass reads every weight once and does little else, so its speed is these products' share
of HBM bandwidth. cuBLAS does not serve every shape well at M = 1 (it ran Ouro's 2048 x 2048
projection split-K at a fraction of the bandwidth), so one-row products on CUDA all come here.

The GEMV can also compute its input row itself (a prologue) instead of a separate launch making it:
SwiGLU of the [gate; up] projection (the down projection), or the residual add and RMSNorm before a
projection. Each program recomputes the row from the previous kernel's outputs, rounding as the
separate kernels do. Off by default (measured slower, below); RLT_FUSED_GEMV=1 turns it on.
"""

import os

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.norm import rstd, scale

# (rows of w per program, K per load, warps): few wide loads per program keep many bytes in flight.
# CONFIGS is the set the kernel is tested and tuned over (scripts/tune_decode.py). The engine uses
# CONFIG for every shape: picking per shape by isolated timings (L2 flushed, interleaved rounds)
# gave unstable picks, some on cuBLAS, and a slower engine (Ouro-1.4B, conc 1, H200, b0fe606: 181.5
# tok/s picked against 206.5 at CONFIG; docs/benchmarks.md).
CONFIGS = ((2, 1024, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4))
# RLT_GEMV_CONFIG=4,1024,4 runs another (A/B measurements)
CONFIG = tuple(map(int, os.environ["RLT_GEMV_CONFIG"].split(","))) if os.environ.get("RLT_GEMV_CONFIG") else CONFIGS[0]
# The input prologues measured slower in the engine (182.9 against 206.5 tok/s at CONFIG, b0fe606:
# each program re-reads the whole input rows), so they are off unless RLT_FUSED_GEMV=1.
fused = os.environ.get("RLT_FUSED_GEMV", "0") == "1"

# Prologues: how a program gets its input row x.
PLAIN, SWIGLU, NORM, ADD_NORM, NORMED_ADD_NORM = range(5)
# PLAIN: x as given. SWIGLU: x = silu(gate) * up of the [gate; up] row given (2K wide).
# NORM: x = rms_norm(r, w_out). ADD_NORM: r' = r + a, x = rms_norm(r', w_out).
# NORMED_ADD_NORM: r' = r + rms_norm(a, w_a), x = rms_norm(r', w_out). r' is stored (program 0).
_SWIGLU, _NORM, _ADD_NORM, _NORMED_ADD_NORM = (tl.constexpr(p) for p in range(1, 5))  # the same, for kernels


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


def linear_one_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w.T by the Triton GEMV at CONFIG."""
    return gemv(x.contiguous(), w, CONFIG)


def fused_one_row(x: torch.Tensor, w: torch.Tensor, prologue: int, a: torch.Tensor | None = None,
                  weight_a: torch.Tensor | None = None, weight_out: torch.Tensor | None = None, eps: float = 0.0,
                  residual_out: torch.Tensor | None = None) -> torch.Tensor:
    """gemv with a prologue at CONFIG (arguments as gemv's); callers use it where `fused`."""
    return gemv(x, w, CONFIG, prologue, a, weight_a, weight_out, eps, residual_out)


def choices() -> dict:
    """The GEMV setup (for benchmark logs)."""
    return {"config": "%dx%d/%dw" % CONFIG, "fused": fused}
