"""Huginn-0125: prelude -> core iterated r times with input injection -> coda.

embed: e = prelude(wte[ids] * embed_scale). Each step: s = core(adapter([s; e])).
head: logits = wte . ln_f(coda(ln_f(s))). Blocks are sandwich blocks that norm the residual
sums: x = n2(x + attn(n1 x)); x = n4(x + mlp(n3 x)). Attention adds qk_bias before RoPE on
adjacent pairs. Prelude and coda are boundary layers (KV stored once); core layers are per depth.
"""

import torch
import torch.nn.functional as F

from rlt.kernels.random import STREAM_STATE_INIT, truncated_normal_of
from rlt.models.base import Attention, Rotary
from rlt.models.layers import gated_mlp, rope_inv_freq
from rlt.models.model_config import ModelConfig
from rlt.models.ops import REFERENCE

_BLOCK_TENSORS = (
    "norm_1.weight",
    "norm_2.weight",
    "norm_3.weight",
    "norm_4.weight",
    "attn.Wqkv.weight",
    "attn.qk_bias",
    "attn.proj.weight",
    "mlp.fc.weight",
    "mlp.proj.weight",
)


def _stack_names(fc) -> list[str]:
    return (
        [f"prelude.{i}" for i in range(fc.n_layers_in_prelude)]
        + [f"core_block.{i}" for i in range(fc.n_layers_in_recurrent_block)]
        + [f"coda.{i}" for i in range(fc.n_layers_in_coda)]
    )


class HuginnModel:
    ops = REFERENCE  # the kernel set its layers run (rlt/models/ops.py): its engine's backend's

    @staticmethod
    def expected_tensors(mc: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor name this model reads, with its shape from config.json."""
        fc = mc.family_config
        H, I, V, nh, hd = (
            fc.hidden_size,
            fc.intermediate_size,
            fc.vocab_size,
            fc.num_attention_heads,
            fc.head_dim,
        )
        shapes = {
            "attn.Wqkv.weight": (3 * nh * hd, H),
            "attn.qk_bias": (2, 1, nh, hd),
            "attn.proj.weight": (H, nh * hd),
            "mlp.fc.weight": (2 * I, H),
            "mlp.proj.weight": (H, I),
        }
        out = {
            "transformer.wte.weight": (V, H),
            "transformer.adapter.weight": (H, 2 * H),
            "transformer.ln_f.weight": (H,),
            "lm_head.weight": (V, H),
        }
        for blk in _stack_names(fc):
            for name in _BLOCK_TENSORS:
                if name == "attn.qk_bias" and not fc.qk_bias:
                    continue
                out[f"transformer.{blk}.{name}"] = shapes.get(name, (H,))
        return out

    def __init__(self, mc: ModelConfig, w: dict[str, torch.Tensor]):
        fc = self.fc = mc.family_config
        self.wte = w["transformer.wte.weight"]
        self.adapter = w["transformer.adapter.weight"]
        self.ln_f = w["transformer.ln_f.weight"]

        def block(name):
            p = f"transformer.{name}."
            bias = w.get(p + "attn.qk_bias")
            return dict(
                n1=w[p + "norm_1.weight"],
                n2=w[p + "norm_2.weight"],
                n3=w[p + "norm_3.weight"],
                n4=w[p + "norm_4.weight"],
                qkv=w[p + "attn.Wqkv.weight"],
                proj=w[p + "attn.proj.weight"],
                q_bias=None if bias is None else bias[0, 0],
                k_bias=None if bias is None else bias[1, 0],
                fc=w[p + "mlp.fc.weight"],
                mlp_proj=w[p + "mlp.proj.weight"],
            )

        self.prelude = [block(f"prelude.{i}") for i in range(fc.n_layers_in_prelude)]
        self.core = [block(f"core_block.{i}") for i in range(fc.n_layers_in_recurrent_block)]
        self.coda = [block(f"coda.{i}") for i in range(fc.n_layers_in_coda)]
        self.inv_freq = rope_inv_freq(fc.head_dim, fc.rope_theta).to(self.wte.device)

    def _block(self, B, x, positions, attend):
        fc, eps, ops = self.fc, self.fc.rms_norm_eps, self.ops
        T, nh, hd = x.shape[0], fc.num_attention_heads, fc.head_dim
        q, k, v = ops.linear(ops.rms_norm(x, B["n1"], eps), B["qkv"]).view(T, 3, nh, hd).unbind(1)
        # (qk_bias added there)
        rotary = Rotary(positions, self.inv_freq, True, B["q_bias"], B["k_bias"])
        a = ops.linear(attend(q, k, v, rotary).flatten(1), B["proj"])
        x = ops.rms_norm(x + a, B["n2"], eps)
        return ops.rms_norm(
            x + gated_mlp(ops, ops.rms_norm(x, B["n3"], eps), B["fc"], B["mlp_proj"]), B["n4"], eps
        )

    def embed(self, ids, positions, attn: Attention):
        x = F.embedding(ids, self.wte) * self.fc.embed_scale
        for j, B in enumerate(self.prelude):
            x = self._block(B, x, positions, lambda q, k, v, r, j=j: attn.boundary(j, q, k, v, r))
        return x

    def initial_state(self, inject, positions, seeds):
        if self.fc.state_init == "zero":
            return torch.zeros_like(inject)
        # Truncated normal at +-3 std, times embed_scale, drawn per (seed, position): a request's
        # latent never depends on its batch or worker.
        z = truncated_normal_of(
            self.ops.random_bits_rows(seeds, STREAM_STATE_INIT, positions, inject.shape[-1])
        )
        return (z * (self.fc.state_std * self.fc.embed_scale)).to(inject.dtype)

    def loop(self, s, inject, positions, attn: Attention):
        x = self.ops.linear(torch.cat([s, inject], dim=-1), self.adapter)
        for j, B in enumerate(self.core):
            x = self._block(B, x, positions, lambda q, k, v, r, j=j: attn.core(j, q, k, v, r))
        return x, None

    def head(self, s, positions, attn: Attention, select=None):
        x = self.after_loop(s, positions, attn)
        return self.project(x if select is None else x[select])

    def after_loop(self, s, positions, attn: Attention):
        x = self.ops.rms_norm(s, self.ln_f, self.fc.rms_norm_eps)
        P = self.fc.n_layers_in_prelude
        for j, B in enumerate(self.coda):
            x = self._block(
                B, x, positions, lambda q, k, v, r, j=j: attn.boundary(P + j, q, k, v, r)
            )
        return x

    def project(self, x):
        x = self.ops.rms_norm(x, self.ln_f, self.fc.rms_norm_eps)
        return self.ops.linear(x, self.wte).float()
