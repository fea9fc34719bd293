"""Building blocks shared by the three families: the torch reference of each layer operation (a
model runs them through its kernel set, rlt/models/ops.py), and the pieces built on them."""

import torch
import torch.nn.functional as F

from rlt.models.base import Rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm: normalise in float32, cast back, then scale (no +1 offset). Triton: one launch
    (also batch-invariant) instead of ~7 torch kernels (rlt/kernels/norm.py)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def add_norm(
    x: torch.Tensor,
    a: torch.Tensor,
    weight_a: torch.Tensor | None,
    weight_out: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, then the next norm: x_new = x + (rms_norm(a, weight_a) if weight_a is given
    else a); returns (x_new, rms_norm(x_new, weight_out)). Triton: one launch instead of three."""
    x = x + (a if weight_a is None else rms_norm(a, weight_a, eps))
    return x, rms_norm(x, weight_out, eps)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    pairs: bool,
    q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [T, H, D] and k [T, Hkv, D], after their per-head biases if given: adjacent pairs
    (Huginn) or rotate-half. The Triton attention does it in place in the launch that stores k and v
    (rlt/kernels/rope.py)."""
    if q_bias is not None:
        q, k = q + q_bias, k + k_bias
    f = rope_pairs if pairs else rope_neox
    return f(q, positions, inv_freq), f(k, positions, inv_freq)


def rope_neox(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Llama/Qwen2), the reference. x [T, H, D]; positions [T]."""
    freqs = positions.float().unsqueeze(1) * inv_freq.to(positions.device).unsqueeze(0)  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_pairs(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE on adjacent (even, odd) pairs as complex numbers (Huginn), the reference. Computed in
    float32."""
    freqs = positions.float().unsqueeze(1) * inv_freq.to(positions.device).unsqueeze(0)  # [T, D/2]
    cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    re, im = xf[..., 0], xf[..., 1]
    out = torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from the fused [gate; up] projection output; Triton: one launch."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def split_qkv(qkv, num_heads, num_kv_heads, head_dim):
    """The fused [q; k; v] projection's output -> q [T, H, D], k/v [T, Hkv, D] (views, head-major)."""
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    T = qkv.shape[0]
    return (
        q.view(T, num_heads, head_dim),
        k.view(T, num_kv_heads, head_dim),
        v.view(T, num_kv_heads, head_dim),
    )


def llama_attention(ops, h, L: dict, fc, positions, inv_freq, attn, layer: int) -> torch.Tensor:
    """Ouro / Nanbeige self-attention of one core layer on normed input h, up to the output
    projection (the caller applies L["o"]): fused q/k/v projection, then paged attention at this
    layer with rotate-half RoPE -> [T, H * D]. ops: the model's kernel set."""
    heads = (fc.num_attention_heads, fc.num_key_value_heads, fc.head_dim)
    return attn.core_qkv(
        layer, ops.linear, h, L["qkv"], heads, Rotary(positions, inv_freq, False)
    ).flatten(1)


def gated_mlp(ops, x, gate_up_w, down_w):
    """SwiGLU with a fused [gate; up] weight: down(silu(gate(x)) * up(x)). ops: the model's kernel set."""
    return ops.linear(ops.linear_swiglu(x, gate_up_w), down_w)


def fused_llama_layer(w: dict, prefix: str, norms: dict[str, str]) -> dict:
    """A Llama/Qwen2 layer's weights with q/k/v and gate/up fused; norms maps short name -> tensor name."""
    return dict(
        qkv=torch.cat([w[prefix + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
        o=w[prefix + "self_attn.o_proj.weight"],
        gate_up=torch.cat([w[prefix + "mlp.gate_proj.weight"], w[prefix + "mlp.up_proj.weight"]]),
        down=w[prefix + "mlp.down_proj.weight"],
        **{k: w[prefix + name + ".weight"] for k, name in norms.items()},
    )


class EmbeddingInput:
    """Ouro and Nanbeige: the loop's input is the token embedding itself (no prelude, no state draw)."""

    embed_w: torch.Tensor

    def embed(self, ids, positions, attn):
        return F.embedding(ids, self.embed_w)

    def initial_state(self, inject, positions, seeds):
        return inject
