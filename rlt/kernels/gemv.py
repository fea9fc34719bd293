"""One-row GEMM (GEMV) in Triton, for decode passes of one row: y = x @ w.T with x [1, K].

Such a pass reads every weight once and does little else, so its speed is these products' share
of HBM bandwidth. cuBLAS does not serve every shape well at M = 1 (some it runs split-K at a
fraction of the bandwidth), so one-row products on CUDA all come here.

The [gate; up] product also finishes the SwiGLU (an epilogue: each program computes the same rows
of the gate and the up projection), which costs the chain nothing. The residual add and RMSNorm
after a projection are a launch of their own (rlt/kernels/norm.py): with PDL that kernel boundary
measured cheaper than the product's last program finishing the row behind an arrival counter.
The products before that launch (o after the attention, down after the SwiGLU product) read two
K tiles before their PDL wait (NORMED_EARLY_TILES): the kernels they wait on leave HBM idle (the
attention is a latency chain, a product's tail a part wave). A third tile takes registers enough to
drop a resident program per SM (12 -> 10), and a 3,072-row product (Nanbeige4.2-3B) no longer fits
in one wave; the q/k/v and [gate; up] products keep one (more measured slower).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@dataclass(frozen=True)
class GemvConfig:
    """Rows of w per program, K per load, warps."""

    rows: int
    k: int
    warps: int

    def __str__(self) -> str:
        return f"{self.rows}x{self.k}/{self.warps}w"


# Few wide loads per program keep many bytes in flight. One config serves every shape: per-shape
# picks from isolated timings are unstable and do not carry over to the engine. A program reads
# only its first 1024-wide K tile before the PDL wait: wider tiles take more registers, fewer
# programs per SM, and a 2048-row projection would not fit in one wave (rlt/kernels/occupancy.py).
CONFIG = GemvConfig(2, 1024, 4)
# The configs the kernel is tested over (passed explicitly).
CONFIGS = tuple(
    GemvConfig(*c)
    for c in ((2, 1024, 4), (4, 1024, 4), (2, 2048, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4))
)
NORMED_EARLY_TILES = 2  # K tiles read before the wait by a product whose output is added and normed

PLAIN, SWIGLU = range(2)  # epilogues
_SWIGLU = tl.constexpr(SWIGLU)  # the same, for kernels


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    N,
    K,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    EARLY: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = x @ w.T. SWIGLU: w is [gate; up] (2N rows), y = silu(x @ gate.T) * (x @ up.T), rounded as
    the separate launches round. EARLY: K tiles read before the PDL wait (1 to 3, at most K's)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_up = rows + N * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    dt = y_ptr.dtype.element_ty
    # The first EARLY weight tiles are read before waiting on the previous kernel (with PDL their
    # reads
    # overlap that kernel's tail): weights are never written during a pass. x only after the wait.
    w, w_up = _w_tile(rows, rows_up, offs_k, n_ok, K, EPILOGUE)
    w1, u1, w2, u2 = w, w_up, w, w_up  # (placeholders unless EARLY says otherwise)
    if EARLY > 1:
        w1, u1 = _w_tile(rows, rows_up, BLOCK_K + offs_k, n_ok, K, EPILOGUE)
    if EARLY > 2:
        w2, u2 = _w_tile(rows, rows_up, 2 * BLOCK_K + offs_k, n_ok, K, EPILOGUE)
    pdl.begin(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    if EARLY == 1:
        for k0 in range(0, K, BLOCK_K):
            w, w_up, acc, acc_up = _k_tile(
                x_ptr, rows, rows_up, w, w_up, acc, acc_up, k0 + offs_k, n_ok, K, k0 > 0, EPILOGUE
            )
    else:
        _, _, acc, acc_up = _k_tile(
            x_ptr, rows, rows_up, w, w_up, acc, acc_up, offs_k, n_ok, K, False, EPILOGUE
        )
        kk = BLOCK_K + offs_k
        _, _, acc, acc_up = _k_tile(
            x_ptr, rows, rows_up, w1, u1, acc, acc_up, kk, n_ok, K, False, EPILOGUE
        )
        if EARLY > 2:
            kk = 2 * BLOCK_K + offs_k
            _, _, acc, acc_up = _k_tile(
                x_ptr, rows, rows_up, w2, u2, acc, acc_up, kk, n_ok, K, False, EPILOGUE
            )
        for k0 in range(EARLY * BLOCK_K, K, BLOCK_K):
            w, w_up, acc, acc_up = _k_tile(
                x_ptr, rows, rows_up, w, w_up, acc, acc_up, k0 + offs_k, n_ok, K, True, EPILOGUE
            )
    acc = tl.sum(acc, axis=1)
    acc_up = tl.sum(acc_up, axis=1)
    y = acc.to(dt)
    if EPILOGUE == _SWIGLU:
        g = y.to(tl.float32)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + offs_n, y, mask=n_ok)


@triton.jit
def _w_tile(rows, rows_up, kk, n_ok, K, EPILOGUE: tl.constexpr):
    """The weights of K tile kk -> (w, w_up); w_up is a placeholder without the SwiGLU."""
    w = tl.load(rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)
    w_up = 0.0
    if EPILOGUE == _SWIGLU:
        w_up = tl.load(rows_up + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)
    return w, w_up


@triton.jit
def _k_tile(
    x_ptr, rows, rows_up, w, w_up, acc, acc_up, kk, n_ok, K, LOAD_W, EPILOGUE: tl.constexpr
):
    """One K tile (columns kk) of the product into the tile accumulators; LOAD_W: read its weights
    (the first tile's, w / w_up, were read before the PDL wait) -> (w, w_up, acc, acc_up)."""
    if LOAD_W:
        w, w_up = _w_tile(rows, rows_up, kk, n_ok, K, EPILOGUE)
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * x[None, :]
    if EPILOGUE == _SWIGLU:
        acc_up += w_up.to(tl.float32) * x[None, :]
    return w, w_up, acc, acc_up


def gemv(
    x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG, early_tiles: int = 1
) -> torch.Tensor:
    """x [1, K] (contiguous), w [N, K] (rows contiguous) -> x @ w.T [1, N] in x's dtype. early_tiles:
    K tiles read before the PDL wait (1 to 3; NORMED_EARLY_TILES before an add + norm)."""
    return _launch(x, w, config, PLAIN, w.shape[0], early_tiles)


def gemv_swiglu(
    x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG, early_tiles: int = 1
) -> torch.Tensor:
    """x [1, K], w the fused [gate; up] weight [2I, K] -> silu(x @ gate.T) * (x @ up.T) [1, I]."""
    return _launch(x, w, config, SWIGLU, w.shape[0] // 2, early_tiles)


def _launch(x, w, config: GemvConfig, epilogue, N, early_tiles=1):
    assert 1 <= early_tiles <= 3, early_tiles
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    pdl.launch(
        _gemv_kernel,
        (triton.cdiv(N, config.rows),),
        x.contiguous(),
        w,
        y,
        N,
        w.shape[1],
        w.stride(0),
        BLOCK_N=config.rows,
        BLOCK_K=config.k,
        EPILOGUE=epilogue,
        EARLY=min(early_tiles, triton.cdiv(w.shape[1], config.k)),
        num_warps=config.warps,
        like=x,
    )
    return y
