"""Batched sampling: greedy, temperature, top-k, top-p, per-request seed; no per-row Python loop.

Sampling is Gumbel-max over counter-based noise: the noise for output position i of a request is
a pure function of (seed, i, token id), so a request's tokens never depend on its batch-mates or
on which worker samples it.
"""

from dataclasses import dataclass

import torch

from rlt.kernels.random import gumbel


@dataclass
class SamplingTensors:
    """Per-row parameters, each a [B] tensor on the logits' device."""

    temperature: torch.Tensor  # float32; 0 means greedy
    top_k: torch.Tensor  # int64; <= 0 means off
    top_p: torch.Tensor  # float32 in (0, 1]
    seed: torch.Tensor  # int64
    output_index: torch.Tensor  # int64: which output token of its request this row samples


def sample(logits: torch.Tensor, p: SamplingTensors, greedy: bool | None = None, filtered: bool = True) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64). What the caller knows saves device work and
    read-backs: greedy, every temperature is 0; filtered=False, no row uses top-k or top-p (no sort)."""
    logits = logits.float()
    if greedy is None:
        greedy = bool((p.temperature == 0).all())
    if greedy:
        return logits.argmax(dim=-1)
    greedy = logits.argmax(dim=-1)
    scaled = logits / torch.where(p.temperature > 0, p.temperature, 1.0).unsqueeze(1)
    rank = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    noise = gumbel(p.seed.unsqueeze(1), p.output_index.unsqueeze(1), rank)
    if filtered:
        scaled = scaled.masked_fill(dropped(scaled, p.top_k, p.top_p), float("-inf"))
    return torch.where(p.temperature > 0, (scaled + noise).argmax(dim=-1), greedy)


def dropped(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, V] mask of tokens outside top-k, then outside the smallest prefix of the renormalised
    distribution whose mass reaches top_p (the first token always stays; top_p = 1 drops nothing)."""
    V = scaled.shape[1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=scaled.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, V).clamp(max=V).unsqueeze(1)
    probs = sorted_logits.masked_fill(rank >= k, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # (rank > 0: a top_p that rounds to 0 in float32 still keeps the first token)
    drop_sorted = (rank >= k) | ((mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1) & (rank > 0))
    return torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)


def top_logprobs(logits: torch.Tensor, k: int, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the top-k of log_softmax(logits), then the sampled token's own (column k, as vLLM
    returns it: of the distribution before temperature, top-k and top-p): (values [B, k + 1]
    float32, ids [B, k + 1] int64)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(k, dim=-1)
    own = tokens.view(-1, 1)
    return torch.cat([values, logp.gather(1, own)], 1), torch.cat([ids, own], 1)


def top_dict(top: list, row: int, k: int) -> dict[int, float] | None:
    """A row's k most likely tokens and its sampled one as {id: logprob}, from the read-back
    (values, ids) lists of top_logprobs; None if k is 0."""
    if not k:
        return None
    values, ids = top[0][row], top[1][row]
    return dict(zip(ids[:k] + ids[-1:], values[:k] + values[-1:]))
