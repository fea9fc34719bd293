"""A simple in-process engine: one request at a time over a dense per-request KV cache.

It serves `rlt generate` until the paged, batched engine replaces it, and it is the semantic
reference the batched engine is tested against: prompts run at full depth; a decode token that
exits at depth e < D has its depth-e K/V copied into deeper planes (LAST_EXITED), so later queries
at depth d read version min(d, e).
"""

from dataclasses import dataclass, field

import torch

from rlt.config import ModelConfig
from rlt.control.validation import ResolvedParams
from rlt.kernels.attention import causal_attention
from rlt.kernels.sampler import SamplingTensors, sample, top_logprobs
from rlt.workers.exit_policy import should_exit, update_survival


class DenseKV:
    """Per-request KV: core layers one plane per depth, boundary layers once. Implements Attention."""

    def __init__(self, mc: ModelConfig):
        g = mc.kv
        self.core_kv = [[None] * g.num_core_layers for _ in range(mc.depth)]  # [plane][layer] -> (K, V)
        self.boundary_kv = [None] * g.num_boundary_layers
        self.plane = 0  # the depth plane core calls write and read (0-based)

    @staticmethod
    def _append_attend(store, idx, q, k, v):
        old = store[idx]
        K, V = (k, v) if old is None else (torch.cat([old[0], k]), torch.cat([old[1], v]))
        store[idx] = (K, V)
        return causal_attention(q, K, V, q_start=K.shape[0] - q.shape[0])

    def core(self, layer, q, k, v):
        return self._append_attend(self.core_kv[self.plane], layer, q, k, v)

    def boundary(self, layer, q, k, v):
        return self._append_attend(self.boundary_kv, layer, q, k, v)

    def finalize_exit(self, exit_depth: int) -> None:
        """The last position exited at exit_depth: copy its K/V there into every deeper plane."""
        src = self.core_kv[exit_depth - 1]
        for plane in self.core_kv[exit_depth:]:
            for i, (K, V) in enumerate(plane):
                plane[i] = (torch.cat([K, src[i][0][-1:]]), torch.cat([V, src[i][1][-1:]]))


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None


class DenseEngine:
    def __init__(self, mc: ModelConfig, model, device: str = "cpu"):
        self.mc, self.model, self.device = mc, model, device

    def _step(self, kv: DenseKV, ids: list[int], start: int, p: ResolvedParams, decode: bool):
        """Run positions start..start+len(ids)-1; return (logits of the last position, exit depth)."""
        dev = self.device
        positions = torch.arange(start, start + len(ids), device=dev)
        ids_t = torch.tensor(ids, device=dev)
        seeds = torch.full_like(positions, p.state_seed)
        inject = self.model.embed(ids_t, positions, kv)
        state = self.model.initial_state(inject, positions, seeds)
        one = lambda x: torch.tensor([x], device=dev)  # noqa: E731
        survival = torch.ones(1, device=dev)
        depth = self.mc.depth
        for d in range(1, self.mc.depth + 1):
            kv.plane = d - 1
            state, gate = self.model.loop(state, inject, positions, kv)
            if decode:
                survival = update_survival(survival, gate)
                if bool(should_exit(one(d), survival, one(p.min_loops), one(p.max_loops), one(p.exit_threshold))):
                    depth = d
                    break
        if depth < self.mc.depth:
            kv.finalize_exit(depth)
        logits = self.model.head(state, positions, kv)[-1:]
        return logits, depth

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], p: ResolvedParams) -> Generation:
        kv, out = DenseKV(self.mc), Generation()
        eos = () if p.ignore_eos else self.mc.eos_token_ids
        logits, depth = self._step(kv, prompt_ids, 0, p, decode=False)
        pos = len(prompt_ids)
        while True:
            i = len(out.token_ids)
            st = SamplingTensors(*(torch.tensor([x], device=self.device) for x in
                                   (p.temperature, p.top_k, p.top_p, p.sampling_seed, i)))
            token = int(sample(logits, st)[0])
            out.token_ids.append(token)
            out.exit_depths.append(depth)
            if p.logprobs:
                vals, idx = top_logprobs(logits, p.logprobs)
                out.logprobs.append(dict(zip(idx[0].tolist(), vals[0].tolist())))
            if token in eos or token in p.stop_token_ids:
                out.finish_reason = "stop"
                return out
            if len(out.token_ids) >= p.max_tokens:
                out.finish_reason = "length"
                return out
            logits, depth = self._step(kv, [token], pos, p, decode=True)
            pos += 1
