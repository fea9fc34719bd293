"""Batch-invariant GEMM in Triton: a row's result never depends on how many other rows
share the call.

cuBLAS and PyTorch's reductions pick algorithms by shape (split-K, tile sizes, vectorisation), so
in bf16 a row computed in a batch of 512 can differ in its last bits from the same row computed
alone; greedy decoding then diverges. This kernel fixes the tiling and the reduction order: every
output element is accumulated over K in the same blocks, in the same order, in float32, whatever
M is. Used when EngineConfig.batch_invariant is on (CUDA); torch's F.linear is the
reference it is tested against. (The row-wise norms in rlt/kernels/norm.py are batch-invariant by
construction: one program per row.)
"""

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M = 64, 128, 64, 8


# One variant for every row count M (a pass has any number of rows).
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K: tl.constexpr,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # grouped launch order: tiles sharing weight columns run together (L2 reuse)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rem = K - k0
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < rem), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < rem) & (offs_n[None, :] < N), other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(
        c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)
    )


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w[N, K].T -> [..., N] in x's dtype (float32 accumulation)."""
    shape = x.shape
    a = x.reshape(-1, shape[-1])
    M, K = a.shape
    N = w.shape[0]
    c = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M:
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _matmul_kernel[grid](
            a,
            w,
            c,
            M,
            N,
            K,
            a.stride(0),
            a.stride(1),
            w.stride(0),
            w.stride(1),
            c.stride(0),
            c.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            GROUP_M=GROUP_M,
            IEEE=x.dtype == torch.float32,
        )
    return c.reshape(*shape[:-1], N)
