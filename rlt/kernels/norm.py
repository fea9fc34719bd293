"""RMSNorm in Triton, alone and fused with the residual add that precedes it.

One program per row with the whole row in registers: the reduction order is fixed by the row
length alone, so a row's result never depends on its batch (batch-invariant by construction).
Rounding follows the torch reference in rlt/models/layers.py step by step: normalise in float32,
cast to the activation dtype, scale by the weight, round; the residual sum is rounded before it is
normalised again.
"""

import torch
import triton
import triton.language as tl

from rlt.kernels import pdl


@triton.jit
def norm_row(x, w, N, eps, OUT_DTYPE: tl.constexpr):
    """x: float32 row, w: the weight row, loaded -> weight * (x / rms(x)) rounded as the reference.
    (Callers load w with the row, or before the PDL wait: a load placed after the reduction's
    barriers is one more dependent round trip.)"""
    y = (x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)).to(OUT_DTYPE)
    return (w.to(tl.float32) * y.to(tl.float32)).to(OUT_DTYPE)


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, y_ptr, stride_x, stride_y, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    # weights: never written in a pass, so before the wait
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    pdl.begin(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        y_ptr + row * stride_y + offs, norm_row(x, w, N, eps, y_ptr.dtype.element_ty), mask=mask
    )


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    a_ptr,
    wa_ptr,
    wo_ptr,
    xo_ptr,
    h_ptr,
    gw_ptr,
    gb_ptr,
    gate_ptr,
    stride_x,
    stride_a,
    stride_xo,
    stride_h,
    N,
    eps,
    NORM_A: tl.constexpr,
    GATE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """GATE: also the exit gate's logit h @ gw.T + gb (float32) of the row, to gate_ptr[row]."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    dt = xo_ptr.dtype.element_ty
    # weights before the wait (never written in a pass)
    wo = tl.load(wo_ptr + offs, mask=mask, other=0.0)
    if NORM_A:
        wa = tl.load(wa_ptr + offs, mask=mask, other=0.0)
    if GATE:
        gw, gb = tl.load(gw_ptr + offs, mask=mask, other=0.0), tl.load(gb_ptr)
    pdl.begin(PDL)
    a = tl.load(a_ptr + row * stride_a + offs, mask=mask, other=0.0)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if NORM_A:
        a = norm_row(a.to(tl.float32), wa, N, eps, dt)
    x = (x.to(tl.float32) + a.to(tl.float32)).to(dt)
    tl.store(xo_ptr + row * stride_xo + offs, x, mask=mask)
    h = norm_row(x.to(tl.float32), wo, N, eps, dt)
    tl.store(h_ptr + row * stride_h + offs, h, mask=mask)
    if GATE:
        tl.store(gate_ptr + row, tl.sum(h.to(tl.float32) * gw, axis=0) + gb)


def _rows(x: torch.Tensor) -> torch.Tensor:
    a = x.reshape(-1, x.shape[-1])
    return a if a.stride(-1) == 1 else a.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    a = _rows(x)
    y = torch.empty(a.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if a.shape[0]:
        pdl.launch(
            _rms_norm_kernel,
            (a.shape[0],),
            a,
            weight,
            y,
            a.stride(0),
            y.stride(0),
            a.shape[1],
            eps,
            BLOCK=triton.next_power_of_2(a.shape[1]),
            like=a,
        )
    return y.reshape(x.shape)


def add_rms_norm(
    x: torch.Tensor,
    a: torch.Tensor,
    weight_a: torch.Tensor | None,
    weight_out: torch.Tensor,
    eps: float,
    exit_gate: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """x_new = x + (rms_norm(a, weight_a) if weight_a is given else a); h = rms_norm(x_new, weight_out).
    x, a [T, N] of one dtype (the weights' dtype too). Returns (x_new, h), one launch; with exit_gate
    (float32 weight [1, N], bias [1]: Ouro's last layer) also h.float() @ weight.T + bias [T]."""
    x2, a2 = _rows(x), _rows(a)
    xo, h = torch.empty_like(x2), torch.empty_like(x2)
    gate = (
        torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        if exit_gate is not None
        else xo
    )
    gw, gb = (
        (exit_gate[0].reshape(-1), exit_gate[1].reshape(-1)) if exit_gate is not None else (xo, xo)
    )
    if x2.shape[0]:
        pdl.launch(
            _add_rms_norm_kernel,
            (x2.shape[0],),
            x2,
            a2,
            weight_out if weight_a is None else weight_a,
            weight_out,
            xo,
            h,
            gw,
            gb,
            gate,
            x2.stride(0),
            a2.stride(0),
            xo.stride(0),
            h.stride(0),
            x2.shape[1],
            eps,
            NORM_A=weight_a is not None,
            GATE=exit_gate is not None,
            BLOCK=triton.next_power_of_2(x2.shape[1]),
            like=x2,
        )
    out = xo.reshape(x.shape), h.reshape(x.shape)
    return out if exit_gate is None else (*out, gate)
