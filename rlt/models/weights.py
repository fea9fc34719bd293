"""The weights a pass reads, whatever the family: each core layer's products, the boundary layers'
(Huginn's prelude and coda), the LM head. For the roofline's and the dense floor's byte counts
and products (rlt/bench/floors.py)."""

import torch

# a layer's (attention in, attention out, MLP in, MLP out) weights: Ouro / Nanbeige, Huginn
_NAMES = (("qkv", "o", "gate_up", "down"), ("qkv", "proj", "fc", "mlp_proj"))


def core_layers(model) -> list[list[torch.Tensor]]:
    """Each core layer's (attention in, attention out, MLP in, MLP out) weights."""
    core = getattr(model, "layers", None) or model.core
    return [[L[n] for n in next(ns for ns in _NAMES if ns[1] in L)] for L in core]


def boundary_layers(model) -> list[list[torch.Tensor]]:
    return [
        [L[n] for n in _NAMES[1]]
        for L in getattr(model, "prelude", []) + getattr(model, "coda", [])
    ]


def head(model) -> torch.Tensor:
    """The LM head's weight [vocab, hidden] (Huginn's is its tied embedding, wte)."""
    lm_head = getattr(model, "lm_head", None)
    return model.wte if lm_head is None else lm_head


def nbytes(layers: list[list[torch.Tensor]]) -> int:
    return sum(w.numel() * w.element_size() for L in layers for w in L)
