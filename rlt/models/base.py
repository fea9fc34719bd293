"""The stage interface every family implements, and the attention interface it calls.

A looped model is run as stages so that one code path serves the dense reference, the paged
engine and the GPU kernels:

    inject = embed(ids, positions, attn)            # Ouro/Nanbeige: embedding; Huginn: prelude output
    state  = initial_state(inject, positions, seeds) # Huginn draws its initial latent here
    state, gate = loop(state, inject, positions, attn)   # one application of the shared core
    logits = head(state, positions, attn, select)   # Huginn: ln_f, coda, ln_f, tied head
           = project(after_loop(state, positions, attn)[select])

Tokens are flattened: every tensor is [T, ...] for T rows (of one or many requests). Attention goes
through an `Attention` object that owns the KV cache; it knows which request, position and loop
depth each row is, so the model code never does.
"""

from typing import NamedTuple, Protocol

import torch


class Rotary(NamedTuple):
    """The RoPE of q and k: angles positions [T] x inv_freq [D/2]; adjacent pairs (Huginn) or
    rotate-half (rlt/models/layers.rope); q and k first get their per-head bias where given
    (Huginn's qk_bias: [H, D] and [Hkv, D]; on CUDA added in the RoPE launch)."""

    positions: torch.Tensor
    inv_freq: torch.Tensor
    pairs: bool
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None


class Attention(Protocol):
    def core(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary: Rotary
    ) -> torch.Tensor:
        """Attention for a core layer at each row's current depth. q [T, H, D], k/v [T, Hkv, D]
        before RoPE: applies it to q and k (in place where it can: on CUDA in the same launch that
        stores k/v), stores k/v for these rows, returns [T, H, D]."""

    def boundary(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary: Rotary
    ) -> torch.Tensor:
        """Same for a boundary layer (stored once per position, not per depth)."""

    def core_qkv(
        self,
        layer: int,
        linear,
        h: torch.Tensor,
        w: torch.Tensor,
        heads: tuple[int, int, int],
        rotary: Rotary,
    ) -> torch.Tensor:
        """core() on the fused q/k/v projection of h: linear(h, w) [T, (H + 2 Hkv) D] split head-major
        (heads: H, Hkv, D), or one kernel doing the projection, RoPE and the K/V store where the
        backend has one for this pass (CUDA: a decode pass of one row)."""


class LoopedModel(Protocol):
    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor, attn: Attention
    ) -> torch.Tensor: ...

    def initial_state(
        self, inject: torch.Tensor, positions: torch.Tensor, seeds: torch.Tensor
    ) -> torch.Tensor: ...

    def loop(
        self, state: torch.Tensor, inject: torch.Tensor, positions: torch.Tensor, attn: Attention
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def head(
        self,
        state: torch.Tensor,
        positions: torch.Tensor,
        attn: Attention,
        select: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """float32 logits of the rows in `select` (all rows if None). Boundary layers (Huginn's coda)
        run on every row, since later positions attend to them: project(after_loop(...)[select])."""

    def after_loop(
        self, state: torch.Tensor, positions: torch.Tensor, attn: Attention
    ) -> torch.Tensor:
        """The layers between the loop and the head (Huginn: ln_f and the coda, over every row,
        storing boundary K/V; the others: none), so rows can be projected a few at a time."""

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of rows out of after_loop()."""
