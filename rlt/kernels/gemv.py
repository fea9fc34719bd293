"""One-row GEMM (GEMV) in Triton, for decode passes of one row: y = x @ w.T with x [1, K].

Such a pass reads every weight once and does little else, so its speed is these products' share
of HBM bandwidth. cuBLAS serves most shapes well at M = 1 but not all (a 2048 x 2048 projection
runs split-K at a fraction of the bandwidth), so the first call per weight shape times cuBLAS and
each config here with the L2 flushed before every call (weights come from HBM in a real pass,
never from L2) and keeps the fastest; during a CUDA-graph capture an undecided shape uses cuBLAS.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from rlt.kernels import pdl

# (rows of w per program, K per load, warps): few wide loads per program keep many bytes in flight.
# (The leaders of scripts/tune_decode.py's isolated timings, tried at 6c10aee, ran 4 % slower in the
# engine than this set, whose pick was 2 x 1024 / 4 warps for every Ouro shape.)
CONFIGS = ((2, 1024, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4))


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    offs_k = tl.arange(0, BLOCK_K)
    # The first weight tile is read before waiting on the previous kernel (with PDL its reads overlap
    # that kernel's tail): weights are never written during a pass. x is read only after the wait.
    w = tl.load(rows + offs_k[None, :], mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    pdl.begin(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if k0 > 0:
            w = tl.load(rows + (k0 + offs_k)[None, :], mask=n_ok[:, None] & (k0 + offs_k < K)[None, :], other=0.0)
        x = tl.load(x_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(y_ptr + offs_n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_ok)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int]) -> torch.Tensor:
    """x [1, K] (contiguous), w [N, K] (rows contiguous) -> [1, N] in x's dtype."""
    N, K = w.shape
    bn, bk, warps = config
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    pdl.launch(_gemv_kernel, (triton.cdiv(N, bn),), x, w, y, N, K, w.stride(0), BLOCK_N=bn, BLOCK_K=bk,
               num_warps=warps, like=x)
    return y


_choice: dict[tuple, tuple | None] = {}  # (w.shape, dtype, device) -> fastest config; None: cuBLAS


def _pick(x: torch.Tensor, w: torch.Tensor) -> tuple | None:
    from triton.testing import do_bench

    times = {None: do_bench(lambda: F.linear(x, w), warmup=5, rep=20, return_mode="median")}
    for cfg in CONFIGS:
        times[cfg] = do_bench(lambda: gemv(x, w, cfg), warmup=5, rep=20, return_mode="median")
    return min(times, key=times.get)


def linear_one_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w.T by the faster of cuBLAS and the Triton GEMV for this weight shape."""
    key = (tuple(w.shape), w.dtype, w.device)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, w)
        _choice[key] = _pick(x.contiguous(), w)
    cfg = _choice[key]
    return F.linear(x, w) if cfg is None else gemv(x.contiguous(), w, cfg)


def choices() -> dict[str, str]:
    """What the picker chose per shape (for benchmark logs)."""
    return {"x".join(map(str, k[0])): "cublas" if c is None else "triton %dx%d/%dw" % c for k, c in _choice.items()}
