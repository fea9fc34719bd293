"""Independent dense references for the three families: whole-sequence recompute, no cache.

Written from the published semantics (shared/reference/models.md), deliberately not sharing code
with rlt.models: weights come straight from safetensors by their official names, attention is an
explicit masked softmax, RoPE is complex multiplication. Early exit follows LAST_EXITED: a position
p that exited at depth e_p contributes, to a query at depth d, the K/V it computed at min(d, e_p).
"""

import json
import math
import os

import torch
from safetensors.torch import load_file


def load_ref(path, overrides=None):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(overrides or {})
    w = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            w.update({k: v.double() for k, v in load_file(os.path.join(path, name)).items()})
    return cfg, w


def norm(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rope_complex(x, pos, theta, interleaved):
    """x [T, H, D]. interleaved: pairs (2j, 2j+1); else NeoX pairs (j, j + D/2)."""
    T, H, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = pos.double()[:, None] * theta ** (-2 * j / D)[None, :]
    rot = torch.polar(torch.ones_like(angle), angle)[:, None, :]
    if interleaved:
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * rot
        return torch.stack([z.real, z.imag], -1).reshape(T, H, D)
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * rot
    return torch.cat([z.real, z.imag], -1)


def attend(q, k, v):
    """q [T, H, D] are the last T of the S positions in k/v [S, Hkv, D]; causal."""
    T, H, D = q.shape
    S = k.shape[0]
    group = H // k.shape[1]
    out = torch.empty_like(q)
    causal = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    for h in range(H):
        s = (q[:, h] @ k[:, h // group].T) / math.sqrt(D)
        s = s.masked_fill(~causal, float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v[:, h // group]
    return out


def silu(x):
    return x * torch.sigmoid(x)


class Ref:
    """Dense model over a whole sequence with per-position exit depths."""

    def __init__(self, path, overrides=None):
        self.cfg, self.w = load_ref(path, overrides)
        self.kind = self.cfg["model_type"]
        c = self.cfg
        if self.kind == "huginn_raven":
            self.H = c["n_embd"]
            self.nh = c.get("n_heads", c.get("num_attention_heads"))
            self.nkv, self.hd = self.nh, self.H // self.nh
            self.depth = c["mean_recurrence"]
            self.eps, self.theta = c["norm_eps"], c["rope_base"]
        else:
            self.H, self.nh = c["hidden_size"], c["num_attention_heads"]
            self.nkv = c.get("num_key_value_heads") or self.nh
            self.hd = c.get("head_dim") or c.get("kv_channels") or self.H // self.nh
            self.depth = c["total_ut_steps"] if self.kind == "ouro" else c["num_loops"]
            self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]

    # --- one layer, with K/V substitution for positions that already exited ---------------
    def _qkv_llama(self, p, x, pos):
        w = self.w
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(-1, self.nh, self.hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(-1, self.nkv, self.hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(-1, self.nkv, self.hd)
        return rope_complex(q, pos, self.theta, False), rope_complex(k, pos, self.theta, False), v

    def _mlp_llama(self, p, x):
        w = self.w
        return (
            silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        ) @ w[p + "mlp.down_proj.weight"].T

    def _huginn_block(self, p, x, pos, kv_hook):
        w, eps, E = self.w, self.eps, self.nh * self.hd
        h = norm(x, w[p + "norm_1.weight"], eps)
        qkv = h @ w[p + "attn.Wqkv.weight"].T
        q, k, v = (
            qkv[:, :E].view(-1, self.nh, self.hd),
            qkv[:, E : 2 * E].view(-1, self.nh, self.hd),
            qkv[:, 2 * E :].view(-1, self.nh, self.hd),
        )
        if p + "attn.qk_bias" in w:
            q, k = q + w[p + "attn.qk_bias"][0], k + w[p + "attn.qk_bias"][1]
        q, k = rope_complex(q, pos, self.theta, True), rope_complex(k, pos, self.theta, True)
        k, v = kv_hook(k, v)
        a = attend(q, k, v).reshape(-1, E) @ w[p + "attn.proj.weight"].T
        x = norm(x + a, w[p + "norm_2.weight"], eps)
        f = norm(x, w[p + "norm_3.weight"], eps) @ w[p + "mlp.fc.weight"].T
        m = (silu(f[:, : f.shape[1] // 2]) * f[:, f.shape[1] // 2 :]) @ w[p + "mlp.proj.weight"].T
        return norm(x + m, w[p + "norm_4.weight"], eps)

    def run(self, tokens, exits, state_noise=None, start=0, core_hook=None, boundary_hook=None):
        """tokens [T]; exits[p] = exit depth of position p (<= self.depth). Returns, per depth d
        (1-based), the state of every position after loop d (positions past their exit keep their
        exit state) and Ouro's gate logits, plus a head(state) function for logits."""
        w, eps = self.w, self.eps
        T = len(tokens)
        ids = torch.tensor(tokens)
        pos = torch.arange(start, start + T)
        exits = torch.tensor(exits)
        no_hook = lambda j: lambda k, v: (k, v)  # noqa: E731
        boundary_hook = boundary_hook or no_hook
        stored = {}  # (depth, layer) -> (k, v) as computed at that depth

        def hook_for(d, layer):
            def hook(k, v):
                stored[(d, layer)] = (k, v)
                k, v = k.clone(), v.clone()
                for p_ in range(T):
                    e = int(exits[p_])
                    if e < d:
                        k[p_], v[p_] = stored[(e, layer)][0][p_], stored[(e, layer)][1][p_]
                return k, v

            return hook

        hook_for = core_hook or hook_for
        states, gates = {}, {}
        if self.kind == "huginn_raven":
            scale = self.cfg.get("init_values", {}).get("embed_scale", math.sqrt(self.H))
            e = w["transformer.wte.weight"][ids] * scale
            for j in range(self.cfg["n_layers_in_prelude"]):
                e = self._huginn_block(f"transformer.prelude.{j}.", e, pos, boundary_hook(j))
            x = (
                torch.zeros(T, self.H, dtype=torch.float64)
                if state_noise is None
                else state_noise.double()
            )
            for d in range(1, self.depth + 1):
                new = torch.cat([x, e], -1) @ w["transformer.adapter.weight"].T
                for j in range(self.cfg["n_layers_in_recurrent_block"]):
                    new = self._huginn_block(
                        f"transformer.core_block.{j}.", new, pos, hook_for(d, j)
                    )
                x = torch.where((exits >= d)[:, None], new, x)
                states[d] = x
            self._coda_pos = pos
            return states, gates
        x = w["model.embed_tokens.weight"][ids]
        L = self.cfg["num_hidden_layers"]
        for d in range(1, self.depth + 1):
            h = x
            for i in range(L):
                p = f"model.layers.{i}."
                if self.kind == "ouro":
                    q, k, v = self._qkv_llama(p, norm(h, w[p + "input_layernorm.weight"], eps), pos)
                    k, v = hook_for(d, i)(k, v)
                    a = attend(q, k, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
                    h = h + norm(a, w[p + "input_layernorm_2.weight"], eps)
                    m = self._mlp_llama(p, norm(h, w[p + "post_attention_layernorm.weight"], eps))
                    h = h + norm(m, w[p + "post_attention_layernorm_2.weight"], eps)
                else:
                    q, k, v = self._qkv_llama(p, norm(h, w[p + "input_layernorm.weight"], eps), pos)
                    k, v = hook_for(d, i)(k, v)
                    h = h + attend(q, k, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
                    h = h + self._mlp_llama(
                        p, norm(h, w[p + "post_attention_layernorm.weight"], eps)
                    )
            if not self.cfg.get("skip_loop_final_norm", False):
                h = norm(h, w["model.norm.weight"], eps)
            x = torch.where((exits >= d)[:, None], h, x)
            states[d] = x
            if self.kind == "ouro":
                gates[d] = (
                    x @ w["model.early_exit_gate.weight"].T + w["model.early_exit_gate.bias"]
                ).squeeze(-1)
        return states, gates

    def logits(self, state, boundary_hook=None):
        """Logits of every position from per-position final states [T, H]."""
        w, eps = self.w, self.eps
        if self.kind == "huginn_raven":
            x = norm(state, w["transformer.ln_f.weight"], eps)
            P = self.cfg["n_layers_in_prelude"]
            for j in range(self.cfg["n_layers_in_coda"]):
                hook = boundary_hook(P + j) if boundary_hook else (lambda k, v: (k, v))
                x = self._huginn_block(f"transformer.coda.{j}.", x, self._coda_pos, hook)
            x = norm(x, w["transformer.ln_f.weight"], eps)
            return x @ w["transformer.wte.weight"].T
        if self.kind == "nanbeige" and self.cfg.get("skip_loop_final_norm", False):
            state = norm(state, w["model.norm.weight"], eps)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return state @ head.T


def ref_generate(
    ref: Ref, prompt, max_tokens, min_loops=1, max_loops=None, threshold=1.0, noise_fn=None
):
    """Greedy generation: exit depth of each new token by the CDF rule on its own gate values. The
    prompt runs at max_loops (as the families' references run it at a given depth)."""
    D = ref.depth
    max_loops = max_loops or D
    tokens, exits = list(prompt), [max_loops] * len(prompt)
    out, depths, logps = [], [], []
    depth_of_next = max_loops
    while len(out) < max_tokens:
        noise = noise_fn(len(tokens)) if noise_fn else None
        # The newest position's states up to its exit do not depend on its own exit depth.
        states, gates = ref.run(tokens, exits, noise)
        if len(out) > 0:
            surv, e = 1.0, max_loops
            for d in range(1, max_loops + 1):
                if gates:
                    surv *= 1 - torch.sigmoid(gates[d][-1]).item()
                if threshold < 1 and d >= min_loops and 1 - surv >= threshold:
                    e = d
                    break
            exits[-1] = e
            depth_of_next = e
        final = torch.stack([states[exits[p]][p] for p in range(len(tokens))])
        lg = ref.logits(final)[-1]
        tok = int(lg.argmax())
        out.append(tok)
        depths.append(depth_of_next)
        logps.append(torch.log_softmax(lg, -1))
        tokens.append(tok)
        exits.append(D)
    return out, depths, logps


def shared_generate(
    ref: Ref,
    prompt,
    max_tokens,
    min_loops=1,
    max_loops=None,
    threshold=1.0,
    noise_fn=None,
    exits=None,
):
    """SHARED layout reference, position by position: a position's loop d attends to its own
    loop-d K/V and to every earlier position's final (exit-depth) K/V, at every depth. The prompt
    runs at max_loops. exits: the decode positions' exit depths, given (else by the gate)."""
    D = ref.depth
    max_loops = max_loops or D
    final = {}  # core layer -> list of (k, v) [1, Hkv, D] per position, at that position's exit
    bnd = {}  # boundary layer -> list of (k, v) per position

    def stacked(store, layer, k, v):
        ks = [kv[0] for kv in store.get(layer, [])] + [k]
        vs = [kv[1] for kv in store.get(layer, [])] + [v]
        return torch.cat(ks), torch.cat(vs)

    def position(tok, q, decode):
        cur = {}

        def core_hook(d, layer):
            def hook(k, v):
                cur[(d, layer)] = (k, v)
                return stacked(final, layer, k, v)

            return hook

        def boundary_hook(j):
            def hook(k, v):
                out = stacked(bnd, j, k, v)
                bnd.setdefault(j, []).append((k, v))
                return out

            return hook

        noise = noise_fn(q + 1)[q:] if noise_fn else None
        states, gates = ref.run(
            [tok], [D], noise, start=q, core_hook=core_hook, boundary_hook=boundary_hook
        )
        e = max_loops
        if decode and exits is not None:
            e = exits[q - len(prompt)]
        elif decode:
            surv, e = 1.0, max_loops
            for d in range(1, max_loops + 1):
                if gates:
                    surv *= 1 - torch.sigmoid(gates[d][0]).item()
                if threshold < 1 and d >= min_loops and 1 - surv >= threshold:
                    e = d
                    break
        for layer in {lay for (_, lay) in cur}:
            final.setdefault(layer, []).append(cur[(e, layer)])
        return ref.logits(states[e], boundary_hook)[-1], e

    for q, tok in enumerate(prompt):
        lg, depth = position(tok, q, decode=False)
    out, depths, logps = [], [], []
    while True:
        tok = int(lg.argmax())
        out.append(tok)
        depths.append(depth)
        logps.append(torch.log_softmax(lg, -1))
        if len(out) == max_tokens:
            return out, depths, logps
        lg, depth = position(tok, len(prompt) + len(out) - 1, decode=True)
