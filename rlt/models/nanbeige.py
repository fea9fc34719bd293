"""Nanbeige4.2: a pre-norm Llama core (GQA, wide q/o: head_dim need not be hidden/heads) run
num_loops times with the same positions; model.norm after every loop (its output feeds the next
loop) unless skip_loop_final_norm, in which case only after the last."""

import torch

from rlt.models.base import Attention
from rlt.models.layers import EmbeddingInput, fused_llama_layer, llama_attention, rope_inv_freq
from rlt.models.model_config import ModelConfig
from rlt.models.ops import REFERENCE


class NanbeigeModel(EmbeddingInput):
    ops = REFERENCE  # the kernel set its layers run (rlt/models/ops.py): its engine's backend's

    @staticmethod
    def expected_tensors(mc: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor name this model reads, with its shape from config.json."""
        fc = mc.family_config
        H, I, V = fc.hidden_size, fc.intermediate_size, fc.vocab_size
        q, kv = fc.num_attention_heads * fc.head_dim, fc.num_key_value_heads * fc.head_dim
        out = {
            "model.embed_tokens.weight": (V, H),
            "model.norm.weight": (H,),
            "lm_head.weight": (V, H),
        }
        for i in range(fc.num_hidden_layers):
            p = f"model.layers.{i}."
            out.update(
                {
                    p + "self_attn.q_proj.weight": (q, H),
                    p + "self_attn.k_proj.weight": (kv, H),
                    p + "self_attn.v_proj.weight": (kv, H),
                    p + "self_attn.o_proj.weight": (H, q),
                    p + "mlp.gate_proj.weight": (I, H),
                    p + "mlp.up_proj.weight": (I, H),
                    p + "mlp.down_proj.weight": (H, I),
                    p + "input_layernorm.weight": (H,),
                    p + "post_attention_layernorm.weight": (H,),
                }
            )
        return out

    def __init__(self, mc: ModelConfig, w: dict[str, torch.Tensor]):
        fc = self.fc = mc.family_config
        self.embed_w = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed_w)
        self.norm_w = w["model.norm.weight"]
        self.layers = []
        for i in range(fc.num_hidden_layers):
            self.layers.append(
                fused_llama_layer(
                    w,
                    f"model.layers.{i}.",
                    dict(n1="input_layernorm", n2="post_attention_layernorm"),
                )
            )
        self.inv_freq = rope_inv_freq(fc.head_dim, fc.rope_theta).to(self.embed_w.device)

    def loop(self, x, inject, positions, attn: Attention):
        fc, eps, layers, ops = self.fc, self.fc.rms_norm_eps, self.layers, self.ops
        h = ops.rms_norm(x, layers[0]["n1"], eps)
        for i, L in enumerate(layers):
            x, h = ops.linear_add_norm(
                llama_attention(ops, h, L, fc, positions, self.inv_freq, attn, i),
                L["o"],
                x,
                None,
                L["n2"],
                eps,
            )
            g = ops.linear_swiglu(h, L["gate_up"])
            if i + 1 < len(layers):  # the residual add, then the next layer's input norm
                x, h = ops.linear_add_norm(g, L["down"], x, None, layers[i + 1]["n1"], eps)
            elif not fc.skip_loop_final_norm:
                _, x = ops.linear_add_norm(g, L["down"], x, None, self.norm_w, eps)
            else:
                x = x + ops.linear(g, L["down"])
        return x, None

    def head(self, x, positions, attn: Attention, select=None):
        return self.project(x if select is None else x[select])

    def after_loop(self, x, positions, attn: Attention):
        return x

    def project(self, x):
        if self.fc.skip_loop_final_norm:
            x = self.ops.rms_norm(x, self.norm_w, self.fc.rms_norm_eps)
        return self.ops.linear(x, self.lm_head).float()
