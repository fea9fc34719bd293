"""SwiGLU activation in Triton: silu(gate) * up from the fused [gate; up] projection, one launch
(torch: silu, then multiply). Rounds as the torch reference: silu's result is rounded to the
activation dtype before the product."""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, stride_gu, stride_out, N, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    pdl.begin(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    g = tl.load(gu_ptr + t * stride_gu + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_gu + N + offs, mask=ok, other=0.0)
    s = (g * tl.sigmoid(g)).to(out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + t * stride_out + offs,
        (s.to(tl.float32) * u.to(tl.float32)).to(out_ptr.dtype.element_ty),
        mask=ok,
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate first) -> silu(gate) * up [T, I]."""
    T, N = gate_up.shape[0], gate_up.shape[1] // 2
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    out = torch.empty(T, N, dtype=gate_up.dtype, device=gate_up.device)
    if T:
        BLOCK = 1024
        pdl.launch(
            _silu_mul_kernel,
            (T, triton.cdiv(N, BLOCK)),
            gate_up,
            out,
            gate_up.stride(0),
            out.stride(0),
            N,
            BLOCK=BLOCK,
            like=gate_up,
        )
    return out
