"""The layer operations a model runs, one object per kernel set: the torch reference, the Triton
kernels of rlt/kernels, or those in batch-invariant mode. A worker's backend (rlt/workers/backend.py)
builds one from its config and hands it to the model (model.ops); each operation is a method
resolved when the set is built, so none asks at run time which set it belongs to."""

import functools

import torch
import torch.nn.functional as F

from rlt.kernels import random
from rlt.models import layers


def gemv_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A product the one-row GEMV takes (rlt/kernels/gemv.py): one row, of the weight's dtype."""
    return x.shape[0] == 1 and x.dtype == w.dtype


def gemv_rows_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A product the two-row GEMV takes (rlt/kernels/gemv_rows.py): two rows, of the weight's
    dtype (every product of such a pass: faster than cuBLAS and the skinny GEMM at both families'
    shapes, docs/performance.md)."""
    return x.shape[0] == 2 and x.dtype == w.dtype


# Decode passes of 3 to SKINNY_ROWS rows: the skinny GEMM (rlt/kernels/skinny_gemm.py) on the
# [gate; up] product and on plain ones up to LAYER_MAX_N rows of w (q/k/v: not the LM heads), where
# K is at least SKINNY_MIN_K: there the engine's passes are faster with it than with cuBLAS
# (Nanbeige4.2-3B's K of 3,072), at Ouro-1.4B's 2,048 they are not (docs/performance.md). The o and
# down products, before an add + norm, stay on cuBLAS (the skinny GEMM is slower on them).
SKINNY_ROWS = 32
SKINNY_MIN_K = 3072
LAYER_MAX_N = 16384


def skinny_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """A product the skinny GEMM takes: 2 to SKINNY_ROWS rows, K >= SKINNY_MIN_K, one dtype."""
    return 2 <= x.shape[0] <= SKINNY_ROWS and w.shape[1] >= SKINNY_MIN_K and x.dtype == w.dtype


class ReferenceOps:
    """The torch reference (rlt/models/layers.py): what the CPU runs, and CUDA with
    EngineConfig.kernels == "reference"."""

    linear = staticmethod(F.linear)
    rms_norm = staticmethod(layers.rms_norm)
    add_norm = staticmethod(layers.add_norm)
    swiglu = staticmethod(layers.swiglu)
    # Counter-based random bits over [rows, columns] (Huginn's initial latent, sampling's noise)
    random_bits_rows = staticmethod(random.random_bits_rows)

    def linear_swiglu(self, x: torch.Tensor, gate_up_w: torch.Tensor) -> torch.Tensor:
        """swiglu(x @ gate_up_w.T) with the fused [gate; up] weight."""
        return self.swiglu(self.linear(x, gate_up_w))

    def linear_add_norm(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        residual: torch.Tensor,
        weight_a: torch.Tensor | None,
        weight_out: torch.Tensor,
        eps: float,
        exit_gate: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """A projection, then the residual add and the next norm: add_norm(residual, x @ w.T,
        weight_a, weight_out, eps) -> (residual', h). exit_gate (float32 weight [1, N], bias [1];
        Ouro's last layer): also the gate's logits h.float() @ weight.T + bias [T]."""
        out = self.add_norm(residual, self.linear(x, w), weight_a, weight_out, eps)
        return (
            out
            if exit_gate is None
            else (*out, self.linear(out[1].float(), *exit_gate).squeeze(-1))
        )


class TritonOps(ReferenceOps):
    """The Triton kernels (CUDA): one launch per norm, residual add + norm (with Ouro's exit gate)
    and SwiGLU; a one-row product (decode at one row) is a GEMV, the [gate; up] one with its SwiGLU;
    a two-row product the two-row GEMV; of more rows the skinny GEMM where skinny_fits."""

    def __init__(self):
        from rlt.kernels import gemv
        from rlt.kernels.activation import silu_mul
        from rlt.kernels.norm import add_rms_norm, rms_norm
        from rlt.kernels.random_triton import random_bits_rows

        self.rms_norm, self.add_norm, self.swiglu = rms_norm, add_rms_norm, silu_mul
        self.random_bits_rows = random_bits_rows  # (one launch: the reference's is some fifty)
        self._gemv, self._gemv_swiglu = gemv.gemv, gemv.gemv_swiglu
        self._gemv_normed = functools.partial(gemv.gemv, early_tiles=gemv.NORMED_EARLY_TILES)
        from rlt.kernels import gemv_rows, skinny_gemm

        self._rows, self._rows_swiglu = gemv_rows.gemv_rows, gemv_rows.gemv_rows_swiglu

        self._skinny, self._skinny_swiglu = skinny_gemm.skinny_gemm, skinny_gemm.skinny_gemm_swiglu

    def linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        if b is None and gemv_fits(x, w):
            return self._gemv(x, w)
        if b is None and gemv_rows_fits(x, w):
            return self._rows(x, w)
        if b is None and w.shape[0] <= LAYER_MAX_N and skinny_fits(x, w):
            return self._skinny(x, w)
        return F.linear(x, w, b)

    def linear_swiglu(self, x: torch.Tensor, gate_up_w: torch.Tensor) -> torch.Tensor:
        if gemv_fits(x, gate_up_w):
            return self._gemv_swiglu(x, gate_up_w)
        if gemv_rows_fits(x, gate_up_w):
            return self._rows_swiglu(x, gate_up_w)
        if skinny_fits(x, gate_up_w):
            return self._skinny_swiglu(x, gate_up_w)
        return self.swiglu(self.linear(x, gate_up_w))

    def linear_add_norm(self, x, w, residual, weight_a, weight_out, eps, exit_gate=None):
        if gemv_fits(x, w):
            y = self._gemv_normed(x, w)
        elif gemv_rows_fits(x, w):
            y = self._rows(x, w)
        else:
            y = F.linear(x, w)
        return self.add_norm(residual, y, weight_a, weight_out, eps, exit_gate)


class BatchInvariantOps(TritonOps):
    """The Triton kernels with products whose per-row result does not depend on the row count
    (rlt/kernels/batch_invariant.py): no one-row GEMV, one GEMM tiling for every pass."""

    linear_swiglu = ReferenceOps.linear_swiglu
    linear_add_norm = ReferenceOps.linear_add_norm

    def __init__(self):
        super().__init__()
        from rlt.kernels.batch_invariant import linear

        self._invariant_linear = linear

    def linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        y = self._invariant_linear(x, w)
        return y if b is None else y + b


REFERENCE = ReferenceOps()
