"""One-row GEMM (GEMV) in Triton, for decode passes of one row: y = x @ w.T with x [1, K].

Such a pass reads every weight once and does little else, so its speed is these products' share
of HBM bandwidth. cuBLAS does not serve every shape well at M = 1 (some it runs split-K at a
fraction of the bandwidth), so one-row products on CUDA all come here.

The GEMV also finishes what follows it instead of a separate launch (an epilogue): SwiGLU, each
program computing the same rows of the gate and the up projection ([gate; up] weight); or the
residual add and RMSNorm after a projection, done by the last program to finish (an arrival
counter), which in Ouro's last layer also takes
the exit gate's dot product. Each saves a launch; a one-row decode pass is hundreds of short ones.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl
from rlt.kernels.norm import norm_row


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
# programs per SM, and a 2048-row projection would not fit in one wave (scripts/gemv_occupancy.py).
CONFIG = GemvConfig(2, 1024, 4)
# The configs the kernel is tested over and scripts/tune_decode.py times (passed explicitly).
CONFIGS = tuple(
    GemvConfig(*c) for c in ((2, 1024, 4), (4, 1024, 4), (2, 2048, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4))
)

PLAIN, SWIGLU, ADD_NORM = range(3)  # epilogues
_SWIGLU, _ADD_NORM = tl.constexpr(SWIGLU), tl.constexpr(ADD_NORM)  # the same, for kernels

MAX_UNROLLED_TILES = 2


def unrolled_tiles(K: int, config: GemvConfig, epilogue: int) -> int:
    """The kernel's K_TILES: K's tile count for an ADD_NORM product of at most two tiles (its K loop
    unrolled), else 0 (a runtime loop). Unrolled, the second tile's weights and both x tiles load in
    one round trip after the PDL wait; the loop multiplies the first tile, waiting for its x, before
    it loads the second. Only ADD_NORM gains: the SwiGLU's code interleaves its loads with the
    multiply-adds anyway, and longer products (the down projection) would take more registers than
    one wave of programs allows."""
    tiles = triton.cdiv(K, config.k)
    return tiles if epilogue == ADD_NORM and tiles <= MAX_UNROLLED_TILES else 0


@functools.cache
def _counter(device: torch.device) -> torch.Tensor:
    """The ADD_NORM arrival counter: zero between launches (the last program resets it). One serves
    every launch: the next ADD_NORM GEMV of a pass runs after a kernel that waited for this one."""
    return torch.zeros(1, dtype=torch.int32, device=device)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    N,
    K,
    stride_wn,
    r_ptr,
    wa_ptr,
    wo_ptr,
    ro_ptr,
    h_ptr,
    count_ptr,
    gw_ptr,
    gb_ptr,
    gate_ptr,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EPILOGUE: tl.constexpr,
    NORM_A: tl.constexpr,
    GATE: tl.constexpr,
    ROW: tl.constexpr,
    K_TILES: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = x @ w.T. SWIGLU: w is [gate; up] (2N rows), y = silu(x @ gate.T) * (x @ up.T), rounded as
    the separate launches round. ADD_NORM: then the last program to finish stores r' = r + (rms_norm(y,
    wa) if NORM_A else y) to ro and h = rms_norm(r', wo) to h, and with GATE the exit gate's logit
    h @ gw.T + gb (float32) to gate. K_TILES > 0: K's tiles, the loop unrolled; 0: a runtime loop."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows_up = rows + N * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    dt = y_ptr.dtype.element_ty
    # The first weight tile is read before waiting on the previous kernel (with PDL its reads overlap
    # that kernel's tail): weights are never written during a pass. x only after the wait.
    mask = n_ok[:, None] & (offs_k < K)[None, :]
    w = tl.load(rows + offs_k[None, :], mask=mask, other=0.0)
    w_up = 0.0  # (the [gate; up] up rows' tile; a placeholder otherwise)
    if EPILOGUE == _SWIGLU:
        w_up = tl.load(rows_up + offs_k[None, :], mask=mask, other=0.0)
    pdl.begin(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    if K_TILES > 0:  # unrolled: a constant k0's loads need nothing before them
        for t in tl.static_range(K_TILES):
            w, w_up, acc, acc_up = _k_tile(
                x_ptr, rows, rows_up, w, w_up, acc, acc_up, t * BLOCK_K + offs_k, n_ok, K, t > 0, EPILOGUE
            )
    else:
        for k0 in range(0, K, BLOCK_K):
            w, w_up, acc, acc_up = _k_tile(
                x_ptr, rows, rows_up, w, w_up, acc, acc_up, k0 + offs_k, n_ok, K, k0 > 0, EPILOGUE
            )
    acc = tl.sum(acc, axis=1)
    acc_up = tl.sum(acc_up, axis=1)
    y = acc.to(dt)
    if EPILOGUE == _SWIGLU:
        g = y.to(tl.float32)
        y = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)).to(dt)
    tl.store(y_ptr + offs_n, y, mask=n_ok)
    if EPILOGUE == _ADD_NORM:
        # Every thread's stores before the release; the last arrival acquires them all (the split-K
        # handshake: a CTA barrier, one gpu-scope acq_rel atomic), then finishes the row as
        # rlt/kernels/norm.py's kernel.
        tl.debug_barrier()
        if tl.atomic_add(count_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            # Every load of the tail at once: one L2 round trip instead of four (a load placed after
            # a reduction waits for its barriers).
            offs_r = tl.arange(0, ROW)
            r_ok = offs_r < N
            a = tl.load(y_ptr + offs_r, mask=r_ok, other=0.0)
            res = tl.load(r_ptr + offs_r, mask=r_ok, other=0.0)
            w_out = tl.load(wo_ptr + offs_r, mask=r_ok, other=0.0)
            if NORM_A:
                w_a = tl.load(wa_ptr + offs_r, mask=r_ok, other=0.0)
            if GATE:
                gw, gb = tl.load(gw_ptr + offs_r, mask=r_ok, other=0.0), tl.load(gb_ptr)
            if NORM_A:
                a = norm_row(a.to(tl.float32), w_a, N, eps, dt)
            r = (res.to(tl.float32) + a.to(tl.float32)).to(dt)
            tl.store(ro_ptr + offs_r, r, mask=r_ok)
            h = norm_row(r.to(tl.float32), w_out, N, eps, dt)
            tl.store(h_ptr + offs_r, h, mask=r_ok)
            if GATE:
                tl.store(gate_ptr, tl.sum(h.to(tl.float32) * gw, axis=0) + gb)
            tl.atomic_xchg(count_ptr, 0)


@triton.jit
def _k_tile(x_ptr, rows, rows_up, w, w_up, acc, acc_up, kk, n_ok, K, LOAD_W, EPILOGUE: tl.constexpr):
    """One K tile (columns kk) of the product into the tile accumulators; LOAD_W: read its weights
    (the first tile's, w / w_up, were read before the PDL wait) -> (w, w_up, acc, acc_up)."""
    if LOAD_W:
        mask = n_ok[:, None] & (kk < K)[None, :]
        w = tl.load(rows + kk[None, :], mask=mask, other=0.0)
        if EPILOGUE == _SWIGLU:
            w_up = tl.load(rows_up + kk[None, :], mask=mask, other=0.0)
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * x[None, :]
    if EPILOGUE == _SWIGLU:
        acc_up += w_up.to(tl.float32) * x[None, :]
    return w, w_up, acc, acc_up


def gemv(x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG) -> torch.Tensor:
    """x [1, K] (contiguous), w [N, K] (rows contiguous) -> x @ w.T [1, N] in x's dtype."""
    return _launch(x, w, config, PLAIN, w.shape[0])[0]


def gemv_swiglu(x: torch.Tensor, w: torch.Tensor, config: GemvConfig = CONFIG) -> torch.Tensor:
    """x [1, K], w the fused [gate; up] weight [2I, K] -> silu(x @ gate.T) * (x @ up.T) [1, I]."""
    return _launch(x, w, config, SWIGLU, w.shape[0] // 2)[0]


def gemv_add_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor,
    weight_a: torch.Tensor | None,
    weight_out: torch.Tensor,
    eps: float,
    config: GemvConfig = CONFIG,
    exit_gate: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """a = x @ w.T, then residual' = residual + (rms_norm(a, weight_a) if weight_a is given else a)
    -> (residual', h = rms_norm(residual', weight_out)), each [1, N]; one launch. exit_gate (float32
    weight [1, N], bias [1]): also h.float() @ weight.T + bias, a third output [1] in float32."""
    N = w.shape[0]
    _, ro, h, gate = _launch(x, w, config, ADD_NORM, N, residual.contiguous(), weight_a, weight_out, eps, exit_gate)
    return (ro, h) if exit_gate is None else (ro, h, gate)


def _launch(
    x, w, config: GemvConfig, epilogue, N, residual=None, weight_a=None, weight_out=None, eps=0.0, exit_gate=None
):
    K = w.shape[1]
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    ro, h = (torch.empty_like(y), torch.empty_like(y)) if epilogue == ADD_NORM else (y, y)
    gate = torch.empty(1, dtype=torch.float32, device=x.device) if exit_gate is not None else y
    gw, gb = (exit_gate[0].reshape(-1), exit_gate[1].reshape(-1)) if exit_gate is not None else (y, y)
    pdl.launch(
        _gemv_kernel,
        (triton.cdiv(N, config.rows),),
        x.contiguous(),
        w,
        y,
        N,
        K,
        w.stride(0),
        y if residual is None else residual,
        y if weight_a is None else weight_a,
        y if weight_out is None else weight_out,
        ro,
        h,
        _counter(x.device),
        gw,
        gb,
        gate,
        eps,
        BLOCK_N=config.rows,
        BLOCK_K=config.k,
        EPILOGUE=epilogue,
        NORM_A=weight_a is not None,
        GATE=exit_gate is not None,
        ROW=triton.next_power_of_2(N) if epilogue == ADD_NORM else 1,
        K_TILES=unrolled_tiles(K, config, epilogue),
        num_warps=config.warps,
        like=x,
    )
    return y, ro, h, gate
