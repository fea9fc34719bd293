"""The GEMV of a few rows: y = x @ w.T with x [M, K], 2 <= M <= 4, for decode passes of a few rows
(a few requests, or a speculation round's verify rows).

Such a pass still reads every weight once, and at a few rows its speed is still the weights' share
of HBM bandwidth: the one-row GEMV's design (rlt/kernels/gemv.py: many small programs, each weight
tile read once, its first tile before the PDL wait) with one accumulator per row of x, each an
in-thread [rows of w, K tile] product summed once at the end. The rows of x are separate
accumulators, not a [M, rows of w, K] tile, so that the weight tile keeps the one-row layout (its
8-element vector loads along K) and each thread multiplies the weights it holds by every row. ROWS
(2 or 4) bounds M for a compiled kernel; rows past M are masked.
"""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.gemv import PLAIN, SWIGLU, GemvConfig, _w_tile

_SWIGLU = tl.constexpr(SWIGLU)
MAX_ROWS = 4
# Per ROWS (rlt bench gemm times the SWEEP): each row of x adds an accumulator tile of registers
# (SwiGLU two), so a program takes one row of w: at 2 rows of x as many registers as the one-row
# GEMV's program of two rows of w (40, with SwiGLU 64, on sm_90), and as many programs per SM.
CONFIGS = {2: GemvConfig(1, 1024, 4), 4: GemvConfig(1, 1024, 4)}
# The configs `rlt bench gemm` times.
SWEEP = tuple(
    GemvConfig(*c) for c in ((1, 1024, 4), (2, 1024, 4), (2, 512, 4), (4, 256, 4), (1, 2048, 8))
)


@triton.jit
def _acc_row(acc, acc_up, wf, uf, x_ptr, r: tl.constexpr, M, kk, K, EPILOGUE: tl.constexpr):
    """Row r of x over K tile kk into its accumulators (wf, uf: the tile's weights in float32)."""
    x = tl.load(x_ptr + kk, mask=kk < tl.where(r < M, K, 0), other=0.0).to(tl.float32)
    acc += wf * x[None, :]
    if EPILOGUE == _SWIGLU:
        acc_up += uf * x[None, :]
    return acc, acc_up


@triton.jit
def _store_row(acc, acc_up, y_ptr, offs_n, N, r: tl.constexpr, M, EPILOGUE: tl.constexpr):
    dt = y_ptr.dtype.element_ty
    y = tl.sum(acc, axis=1).to(dt)
    if EPILOGUE == _SWIGLU:
        g = y.to(tl.float32)
        u = tl.sum(acc_up, axis=1).to(dt).to(tl.float32)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u).to(dt)
    tl.store(y_ptr + offs_n, y, mask=offs_n < tl.where(r < M, N, 0))


@triton.jit
def _gemv_rows_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    PDL: tl.constexpr,
):
    """y[:M] = x[:M] @ w.T, M <= ROWS (2 or 4). SWIGLU: w is [gate; up] (2N rows), rounded as the
    one-row GEMV's epilogue. The first weight tile is read before the PDL wait (weights are never
    written during a pass); x only after it."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_up = rows + N * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    w, w_up = _w_tile(rows, rows_up, offs_k, n_ok, K, EPILOGUE)
    pdl.begin(PDL)
    a0 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    a1, a2, a3, u0, u1, u2, u3 = a0, a0, a0, a0, a0, a0, a0
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        if k0 > 0:
            w, w_up = _w_tile(rows, rows_up, kk, n_ok, K, EPILOGUE)
        wf = w.to(tl.float32)
        uf = wf
        if EPILOGUE == _SWIGLU:
            uf = w_up.to(tl.float32)
        a0, u0 = _acc_row(a0, u0, wf, uf, x_ptr, 0, M, kk, K, EPILOGUE)
        a1, u1 = _acc_row(a1, u1, wf, uf, x_ptr + stride_xm, 1, M, kk, K, EPILOGUE)
        if ROWS > 2:
            a2, u2 = _acc_row(a2, u2, wf, uf, x_ptr + 2 * stride_xm, 2, M, kk, K, EPILOGUE)
            a3, u3 = _acc_row(a3, u3, wf, uf, x_ptr + 3 * stride_xm, 3, M, kk, K, EPILOGUE)
    _store_row(a0, u0, y_ptr, offs_n, N, 0, M, EPILOGUE)
    _store_row(a1, u1, y_ptr + stride_ym, offs_n, N, 1, M, EPILOGUE)
    if ROWS > 2:
        _store_row(a2, u2, y_ptr + 2 * stride_ym, offs_n, N, 2, M, EPILOGUE)
        _store_row(a3, u3, y_ptr + 3 * stride_ym, offs_n, N, 3, M, EPILOGUE)


def gemv_rows(x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] (2 <= M <= 4), w [N, K] (rows contiguous) -> x @ w.T [M, N] in x's dtype."""
    return _launch(x, w, config, PLAIN, w.shape[0])


def gemv_rows_swiglu(
    x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None
) -> torch.Tensor:
    """x [M, K], w the fused [gate; up] weight [2I, K] -> silu(x @ gate.T) * (x @ up.T) [M, I]."""
    return _launch(x, w, config, SWIGLU, w.shape[0] // 2)


def rows_bound(m: int) -> int:
    """The ROWS a product of m rows compiles for."""
    return 2 if m <= 2 else 4


def _launch(x, w, config, epilogue, N):
    M = x.shape[0]
    assert 2 <= M <= MAX_ROWS, M
    rows = rows_bound(M)
    config = config or CONFIGS[rows]
    x = x if x.stride(-1) == 1 else x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    pdl.launch(
        _gemv_rows_kernel,
        (triton.cdiv(N, config.rows),),
        x,
        w,
        y,
        M,
        N,
        w.shape[1],
        x.stride(0),
        w.stride(0),
        y.stride(0),
        BLOCK_N=config.rows,
        BLOCK_K=config.k,
        ROWS=rows,
        EPILOGUE=epilogue,
        num_warps=config.warps,
        like=x,
    )
    return y
