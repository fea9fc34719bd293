"""Ouro: a fully looped Qwen2-style stack with sandwich norms and a learned exit gate.

One loop: for each layer, x += N_in2(Attn(N_in(x))); x += N_post2(MLP(N_post(x))); then
x = model.norm(x). The normed x feeds the next loop, the exit gate and the LM head.
"""

import torch

from rlt.models.base import Attention
from rlt.models.layers import EmbeddingInput, fused_llama_layer, llama_attention, rope_inv_freq
from rlt.models.model_config import ModelConfig
from rlt.models.ops import REFERENCE

_LAYER_TENSORS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "input_layernorm_2",
    "post_attention_layernorm",
    "post_attention_layernorm_2",
)


class OuroModel(EmbeddingInput):
    ops = REFERENCE  # the kernel set its layers run (rlt/models/ops.py): its engine's backend's

    @staticmethod
    def expected_tensors(mc: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor name this model reads, with its shape from config.json."""
        fc = mc.family_config
        H, I, V = fc.hidden_size, fc.intermediate_size, fc.vocab_size
        q, kv = fc.num_attention_heads * fc.head_dim, fc.num_key_value_heads * fc.head_dim
        shapes = {
            "self_attn.q_proj": (q, H),
            "self_attn.k_proj": (kv, H),
            "self_attn.v_proj": (kv, H),
            "self_attn.o_proj": (H, q),
            "mlp.gate_proj": (I, H),
            "mlp.up_proj": (I, H),
            "mlp.down_proj": (H, I),
        }
        out = {
            "model.embed_tokens.weight": (V, H),
            "model.norm.weight": (H,),
            "model.early_exit_gate.weight": (1, H),
            "model.early_exit_gate.bias": (1,),
            "lm_head.weight": (V, H),
        }
        for i in range(fc.num_hidden_layers):
            for name in _LAYER_TENSORS:
                out[f"model.layers.{i}.{name}.weight"] = shapes.get(name, (H,))
        return out

    def __init__(self, mc: ModelConfig, w: dict[str, torch.Tensor]):
        fc = self.fc = mc.family_config
        self.embed_w = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed_w)
        self.norm_w = w["model.norm.weight"]
        self.gate_w, self.gate_b = (
            w["model.early_exit_gate.weight"].float(),
            w["model.early_exit_gate.bias"].float(),
        )
        self.layers = []
        for i in range(fc.num_hidden_layers):
            self.layers.append(
                fused_llama_layer(
                    w,
                    f"model.layers.{i}.",
                    dict(
                        n_in="input_layernorm",
                        n_in2="input_layernorm_2",
                        n_post="post_attention_layernorm",
                        n_post2="post_attention_layernorm_2",
                    ),
                )
            )
        self.inv_freq = rope_inv_freq(fc.head_dim, fc.rope_theta).to(self.embed_w.device)

    def loop(self, x, inject, positions, attn: Attention):
        layers = self.layers
        h = self.ops.rms_norm(x, layers[0]["n_in"], self.fc.rms_norm_eps)
        for i, L in enumerate(layers[:-1]):
            x, h = self._layer(x, h, i, L, positions, attn, layers[i + 1]["n_in"])
        # the last layer ends with model.norm and the exit gate on its output (fp32 gate math)
        _, h, gate = self._layer(
            x,
            h,
            len(layers) - 1,
            layers[-1],
            positions,
            attn,
            self.norm_w,
            (self.gate_w, self.gate_b),
        )
        return h, gate

    def _layer(self, x, h, i, L, positions, attn: Attention, next_norm, exit_gate=None):
        """One decoder layer on (residual x, normed h); ends with the residual add and next_norm."""
        fc, eps, ops = self.fc, self.fc.rms_norm_eps, self.ops
        a = llama_attention(ops, h, L, fc, positions, self.inv_freq, attn, i)
        x, h = ops.linear_add_norm(a, L["o"], x, L["n_in2"], L["n_post"], eps)
        g = ops.linear_swiglu(h, L["gate_up"])
        return ops.linear_add_norm(g, L["down"], x, L["n_post2"], next_norm, eps, exit_gate)

    def head(self, x, positions, attn: Attention, select=None):
        return self.project(x if select is None else x[select])

    def after_loop(self, x, positions, attn: Attention):
        return x

    def project(self, x):
        return self.ops.linear(x, self.lm_head).float()
