"""Single-row GEMM (GEMV) in Triton for decode at concurrency 1: y = x @ w.T with x [1, K].

A decode pass at batch 1 reads every weight once and does nothing else, so its speed is the
bandwidth of these matrix-vector products. Each program streams BLOCK_N whole rows of w (K
contiguous) and reduces them against x in float32. cuBLAS is not always the faster choice at
M = 1, so the first call per weight shape times cuBLAS and each config here on the real weight and
keeps the fastest (outside CUDA-graph capture; during a capture an undecided shape uses cuBLAS).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

CONFIGS = ((8, 512, 4), (16, 256, 4), (4, 1024, 4), (16, 512, 8), (32, 256, 8))  # BLOCK_N, BLOCK_K, warps


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K: tl.constexpr, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(y_ptr + offs_n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_ok)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int]) -> torch.Tensor:
    """x [1, K] (contiguous), w [N, K] (rows contiguous) -> [1, N] in x's dtype."""
    N, K = w.shape
    bn, bk, warps = config
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, bn),)](x, w, y, N, K, w.stride(0), BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
    return y


_choice: dict[tuple, tuple | None] = {}  # (w.shape, dtype, device) -> fastest config, None: cuBLAS


def _time_us(fn, reps: int = 20) -> float:
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def _pick(x: torch.Tensor, w: torch.Tensor) -> tuple | None:
    times = {None: _time_us(lambda: F.linear(x, w))}
    for cfg in CONFIGS:
        times[cfg] = _time_us(lambda: gemv(x, w, cfg))
    return min(times, key=times.get)


def linear_one_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w.T with the faster of cuBLAS and the Triton GEMV for this weight shape."""
    key = (tuple(w.shape), w.dtype, w.device)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, w)
        _choice[key] = _pick(x.contiguous(), w)
    cfg = _choice[key]
    return F.linear(x, w) if cfg is None else gemv(x.contiguous(), w, cfg)
