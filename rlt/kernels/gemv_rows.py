"""The two-row GEMV: y = x @ w.T with x [2, K], for decode passes of two rows (two requests, or a
speculation round's verify of one checked draft).

Such a pass still reads every weight once, and at two rows its speed is still the weights' share of
HBM bandwidth, which cuBLAS leaves 15-55 % below the read rate at these shapes. So the one-row
GEMV's design (rlt/kernels/gemv.py: many small programs, each weight tile read once, its first
tile before the PDL wait) with an accumulator per row of x: each thread multiplies the weights it
holds by both rows. A program takes one row of w, so that its two accumulators take the registers
the one-row GEMV's two rows of w take (sm_90, Triton 3.6: 39 against 40, with the SwiGLU 63 against
62): as many programs per SM.
At 3 and 4 rows the same design (an accumulator a row) measured slower than cuBLAS: every program
reads all of x for its one row of w (docs/performance.md).
"""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.gemv import PLAIN, SWIGLU, GemvConfig, _w_tile

_SWIGLU = tl.constexpr(SWIGLU)
# Rows of w per program, K per load, warps: the best total over Ouro-1.4B's and Nanbeige4.2-3B's
# products in `rlt bench gemm` (one config for every shape, as the one-row GEMV's).
CONFIG = GemvConfig(1, 1024, 4)
# The configs `rlt bench gemm` times.
SWEEP = tuple(
    GemvConfig(*c) for c in ((1, 1024, 4), (2, 1024, 4), (2, 512, 4), (4, 256, 4), (1, 2048, 8))
)


@triton.jit
def _acc_row(acc, acc_up, wf, uf, x_ptr, kk, K, EPILOGUE: tl.constexpr):
    """A row of x over K tile kk into its accumulators (wf, uf: the tile's weights in float32)."""
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    acc += wf * x[None, :]
    if EPILOGUE == _SWIGLU:
        acc_up += uf * x[None, :]
    return acc, acc_up


@triton.jit
def _store_row(acc, acc_up, y_ptr, offs_n, n_ok, EPILOGUE: tl.constexpr):
    dt = y_ptr.dtype.element_ty
    y = tl.sum(acc, axis=1).to(dt)
    if EPILOGUE == _SWIGLU:
        g = y.to(tl.float32)
        u = tl.sum(acc_up, axis=1).to(dt).to(tl.float32)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u).to(dt)
    tl.store(y_ptr + offs_n, y, mask=n_ok)


@triton.jit
def _gemv_rows_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[:2] = x[:2] @ w.T. SWIGLU: w is [gate; up] (2N rows), rounded as the one-row GEMV's
    epilogue. The first weight tile is read before the PDL wait (weights are never written during a
    pass); x only after it."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_up = rows + N * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    w, w_up = _w_tile(rows, rows_up, offs_k, n_ok, K, EPILOGUE)
    pdl.begin(PDL)
    a0 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    a1, u0, u1 = a0, a0, a0
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        if k0 > 0:
            w, w_up = _w_tile(rows, rows_up, kk, n_ok, K, EPILOGUE)
        wf = w.to(tl.float32)
        uf = wf
        if EPILOGUE == _SWIGLU:
            uf = w_up.to(tl.float32)
        a0, u0 = _acc_row(a0, u0, wf, uf, x_ptr, kk, K, EPILOGUE)
        a1, u1 = _acc_row(a1, u1, wf, uf, x_ptr + stride_xm, kk, K, EPILOGUE)
    _store_row(a0, u0, y_ptr, offs_n, n_ok, EPILOGUE)
    _store_row(a1, u1, y_ptr + stride_ym, offs_n, n_ok, EPILOGUE)


def gemv_rows(x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG) -> torch.Tensor:
    """x [2, K] (K contiguous), w [N, K] (rows contiguous) -> x @ w.T [2, N] in x's dtype."""
    return _launch(x, w, config, PLAIN, w.shape[0])


def gemv_rows_swiglu(x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG) -> torch.Tensor:
    """x [2, K], w the fused [gate; up] weight [2I, K] -> silu(x @ gate.T) * (x @ up.T) [2, I]."""
    return _launch(x, w, config, SWIGLU, w.shape[0] // 2)


def _launch(x, w, config: GemvConfig, epilogue, N):
    assert x.shape[0] == 2, x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty(2, N, dtype=x.dtype, device=x.device)
    pdl.launch(
        _gemv_rows_kernel,
        (triton.cdiv(N, config.rows),),
        x,
        w,
        y,
        N,
        w.shape[1],
        x.stride(0),
        w.stride(0),
        y.stride(0),
        BLOCK_N=config.rows,
        BLOCK_K=config.k,
        EPILOGUE=epilogue,
        num_warps=config.warps,
        like=x,
    )
    return y
