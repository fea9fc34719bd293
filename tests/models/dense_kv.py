"""A dense per-request KV cache implementing the models' Attention interface, for stage-level tests."""

import torch

from rlt.kernels.attention import causal_attention
from rlt.models.layers import rope, split_qkv
from rlt.models.model_config import ModelConfig


class DenseKV:
    """Per-request KV: core layers one plane per depth, boundary layers once. Implements Attention."""

    def __init__(self, mc: ModelConfig):
        g = mc.kv
        # [plane][layer] -> (K, V)
        self.core_kv = [[None] * g.num_core_layers for _ in range(mc.depth)]
        self.boundary_kv = [None] * g.num_boundary_layers
        self.plane = 0  # the depth plane core calls write and read (0-based)

    @staticmethod
    def _append_attend(store, idx, q, k, v):
        old = store[idx]
        K, V = (k, v) if old is None else (torch.cat([old[0], k]), torch.cat([old[1], v]))
        store[idx] = (K, V)
        return causal_attention(q, K, V, q_start=K.shape[0] - q.shape[0])

    def core(self, layer, q, k, v, rotary):
        return self._append_attend(self.core_kv[self.plane], layer, *rope(q, k, *rotary), v)

    def boundary(self, layer, q, k, v, rotary):
        return self._append_attend(self.boundary_kv, layer, *rope(q, k, *rotary), v)

    def core_qkv(self, layer, linear, h, w, heads, rotary):
        return self.core(layer, *split_qkv(linear(h, w), *heads), rotary)

    def finalize_exit(self, exit_depth: int) -> None:
        """The last position exited at exit_depth: copy its K/V there into every deeper plane."""
        src = self.core_kv[exit_depth - 1]
        for plane in self.core_kv[exit_depth:]:
            for i, (K, V) in enumerate(plane):
                plane[i] = (torch.cat([K, src[i][0][-1:]]), torch.cat([V, src[i][1][-1:]]))
