"""Skinny GEMM in Triton, for decode passes of 2 to 32 rows: y = x @ w.T with x [M, K], M <= 32.

The engine takes it where rlt/models/ops.py's skinny_fits says (`rlt bench gemm` times it against
cuBLAS per product and config). Like the one-row GEMV
(rlt/kernels/gemv.py) such a product reads every weight once and does little else, so its speed is
its share of HBM bandwidth; cuBLAS reaches some 50-70% of the read rate at these row counts.

A program takes BLOCK_N rows of w and computes the tile transposed, acc [BLOCK_N, BLOCK_M] =
tl.dot(w tile, x tile.T): w's rows fill the MMA's wide side, M (padded to 16 or 32 by masked loads)
its narrow one; tl.dot lets Triton's pipeliner keep `stages` weight tiles in flight in shared
memory. When the N tiles are few against the SMs, K is split (split_k; 0: enough splits to give
every SM a program): each split stores its fp32 partial, and the last to arrive at its tile's
counter sums them in split order (deterministic, one launch) and resets the counter. The [gate; up]
product finishes the SwiGLU in its epilogue, rounded as gemv_swiglu rounds.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.gemv import PLAIN, SWIGLU

_SWIGLU = tl.constexpr(SWIGLU)
MAX_ROWS = 32
# shared memory the pipeline's buffers may take (227 KB per program on H100 / H200)
SMEM = 200 * 1024


@dataclass(frozen=True)
class SkinnyConfig:
    """Rows of w per program, K per tile, K splits (0: auto), warps, pipeline stages."""

    block_n: int
    block_k: int
    split_k: int
    warps: int
    stages: int

    def __str__(self) -> str:
        split = "auto" if self.split_k == 0 else self.split_k
        return f"{self.block_n}x{self.block_k}/s{split}/{self.warps}w{self.stages}st"


# The candidates `rlt bench gemm` times (and tests/kernels/skinny_gemm_interpreted.py checks).
CONFIGS = tuple(
    SkinnyConfig(*c)
    for c in (
        (64, 128, 0, 4, 4),
        (64, 256, 0, 4, 3),
        (32, 256, 0, 4, 4),
        (128, 128, 0, 4, 3),
        (128, 64, 0, 4, 6),
        (32, 512, 0, 4, 3),
        (16, 512, 0, 4, 3),
        (64, 128, 1, 4, 4),
        (128, 128, 1, 8, 3),
        (64, 256, 2, 4, 3),
        (64, 128, 4, 4, 4),
        (32, 128, 8, 4, 4),
    )
)
# the engine's (its passes were measured with it): enough K splits to fill the SMs
CONFIG = CONFIGS[0]


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    split_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    """y [M, N] = x @ w.T. SWIGLU: w is [gate; up] (2N rows), y = silu(x @ gate.T) * (x @ up.T).
    Program (n tile, split) reduces split_tiles K tiles from tile split * split_tiles (K offsets known
    multiples of BLOCK_K: aligned, as the pipeliner's async copies need). SPLIT: more than one split,
    fp32 partials in part_ptr (a [BLOCK_N, BLOCK_M] slot per (n tile, split, gate / up))."""
    pid_n, pid_k, splits = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok, m_ok = offs_n < N, offs_m < M
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_up = rows + N * stride_wn
    x_cols = x_ptr + offs_m[None, :] * stride_xm  # x.T's columns
    offs_k = tl.arange(0, BLOCK_K)
    pdl.begin(PDL)  # (no reads before it: partials and counters are shared by every launch)
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    k_lo = pid_k * split_tiles * BLOCK_K
    for k0 in range(k_lo, tl.minimum(k_lo + split_tiles * BLOCK_K, K), BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        xt = tl.load(x_cols + kk[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0)
        w = tl.load(rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
        if EPILOGUE == _SWIGLU:
            w_up = tl.load(rows_up + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc_up = tl.dot(w_up, xt, acc_up)
    if SPLIT:
        parts: tl.constexpr = 2 if EPILOGUE == _SWIGLU else 1
        tile = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + offs_m[None, :]
        slot = part_ptr + (pid_n * splits + pid_k) * (parts * BLOCK_N * BLOCK_M) + tile
        tl.store(slot, acc)
        if EPILOGUE == _SWIGLU:
            tl.store(slot + BLOCK_N * BLOCK_M, acc_up)
        # the split-K handshake (a CTA barrier, one gpu-scope acq_rel atomic): the last arrival sums
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == splits - 1:
            first = part_ptr + pid_n * splits * (parts * BLOCK_N * BLOCK_M) + tile
            acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            acc_up = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            for s in range(splits):  # (past L1: other SMs wrote them)
                part = first + s * (parts * BLOCK_N * BLOCK_M)
                acc += tl.load(part, cache_modifier=".cg")
                if EPILOGUE == _SWIGLU:
                    acc_up += tl.load(part + BLOCK_N * BLOCK_M, cache_modifier=".cg")
            _store(y_ptr, acc, acc_up, offs_n, offs_m, n_ok, m_ok, stride_ym, EPILOGUE)
            tl.atomic_xchg(count_ptr + pid_n, 0)
    else:
        _store(y_ptr, acc, acc_up, offs_n, offs_m, n_ok, m_ok, stride_ym, EPILOGUE)


@triton.jit
def _store(y_ptr, acc, acc_up, offs_n, offs_m, n_ok, m_ok, stride_ym, EPILOGUE: tl.constexpr):
    """The tile's [BLOCK_N, BLOCK_M] sums -> y's rows (the SwiGLU rounded as gemv_swiglu rounds)."""
    dt = y_ptr.dtype.element_ty
    y = acc.to(dt)
    if EPILOGUE == _SWIGLU:
        g = y.to(tl.float32)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)
    tl.store(
        y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], y, mask=n_ok[:, None] & m_ok[None, :]
    )


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig = CONFIG) -> torch.Tensor:
    """x [M, K] (M <= 32, rows contiguous), w [N, K] (rows contiguous) -> x @ w.T [M, N] in x's dtype."""
    return _launch(x, w, config, PLAIN, w.shape[0])


def skinny_gemm_swiglu(
    x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig = CONFIG
) -> torch.Tensor:
    """x [M, K], w the fused [gate; up] weight [2I, K] -> silu(x @ gate.T) * (x @ up.T) [M, I]."""
    return _launch(x, w, config, SWIGLU, w.shape[0] // 2)


@functools.cache
def _sms(device: torch.device) -> int:
    """SMs to fill (8 on the CPU: the interpreter's stand-in, so its checks split K)."""
    return (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 8
    )


def _scratch(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split launches' fp32 partials and per-tile arrival counters (zero between launches: the
    summing split resets its own), at least these sizes (powers of two: few distinct buffers)."""
    return _buffers(device, 1 << (floats - 1).bit_length(), 1 << (tiles - 1).bit_length())


@functools.cache
def _buffers(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Never freed, so a captured CUDA graph's pointers stay valid (a size's first call, which
    allocates, must come before capture, as the first call compiling the kernel does)."""
    return torch.empty(floats, dtype=torch.float32, device=device), torch.zeros(
        tiles, dtype=torch.int32, device=device
    )


def plan(
    M: int, N: int, K: int, config: SkinnyConfig, device: torch.device
) -> tuple[int, int, int]:
    """-> (BLOCK_M, K splits, K tiles per split): none empty."""
    tiles, k_tiles = triton.cdiv(N, config.block_n), triton.cdiv(K, config.block_k)
    want = config.split_k or min(triton.cdiv(_sms(device), tiles), max(1, k_tiles // 2))
    split_tiles = triton.cdiv(k_tiles, max(1, min(want, k_tiles)))
    return (16 if M <= 16 else 32), triton.cdiv(k_tiles, split_tiles), split_tiles


def _launch(x, w, config: SkinnyConfig, epilogue, N):
    M, K = x.shape
    assert 1 <= M <= MAX_ROWS and w.shape[1] == K and w.stride(1) == 1, (x.shape, w.shape)
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block_m, splits, split_tiles = plan(M, N, K, config, x.device)
    tiles, parts = triton.cdiv(N, config.block_n), 2 if epilogue == SWIGLU else 1
    part, count = y, y  # (unused unless split)
    if splits > 1:
        part, count = _scratch(x.device, tiles * splits * parts * config.block_n * block_m, tiles)
    # SwiGLU tiles take twice the bytes: fewer stages where the buffers would not fit
    stages = max(
        2, min(config.stages, SMEM // ((parts * config.block_n + block_m) * config.block_k * 2))
    )
    pdl.launch(
        _skinny_kernel,
        (tiles, splits),
        x,
        w,
        y,
        part,
        count,
        M,
        N,
        K,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        split_tiles,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        EPILOGUE=epilogue,
        SPLIT=splits > 1,
        num_warps=config.warps,
        num_stages=stages,
        like=x,
    )
    return y
