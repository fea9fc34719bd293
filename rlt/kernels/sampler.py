"""Batched sampling: logit edits, greedy, temperature, min-p, top-k, top-p, per-request seed; no
per-row Python loop.

In vLLM's order: the edits (logit_bias, min_tokens' ban on EOS and stop ids, then the repetition,
frequency and presence penalties) change float32 logits; greedy rows take their argmax; the others
are divided by their temperature, lose the tokens under min_p times the most likely one, then
those outside top-k and top-p. Sampling is Gumbel-max over counter-based noise: the noise for
output position i of a request is a pure function of (seed, i, token id), so a request's tokens
never depend on its batch-mates or on which worker samples it. Logprobs are of the raw logits.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlt.kernels.random import STREAM_SAMPLING, gumbel_of, random_bits_rows


@dataclass
class SamplingTensors:
    """Per-row parameters, each a [B] tensor on the logits' device."""

    temperature: torch.Tensor  # float32; 0 means greedy
    top_k: torch.Tensor  # int64; <= 0 means off
    top_p: torch.Tensor  # float32 in (0, 1]
    seed: torch.Tensor  # int64
    output_index: torch.Tensor  # int64: which output token of its request this row samples
    min_p: torch.Tensor | None = None  # float32, 0 means off; None: no row uses it


@dataclass
class Penalties:
    """Repetition, frequency and presence penalties of some rows. `tokens` lists a row's distinct
    prompt tokens, then its outputs so far (a token may repeat); `counts` is each entry's count
    among those outputs. Entries from `length` on are ignored."""

    rows: torch.Tensor  # [P] int64: rows of the batch
    tokens: torch.Tensor  # [P, n] int64
    counts: torch.Tensor  # [P, n] int32
    length: torch.Tensor  # [P] int64, >= 1
    repetition: torch.Tensor  # [P] float32, 1 = off
    frequency: torch.Tensor  # [P] float32, 0 = off
    presence: torch.Tensor  # [P] float32, 0 = off


@dataclass
class LogitEdits:
    """What changes rows' logits before sampling; None: no row has it."""

    bias: tuple | None = None  # (row [N], token [N], value [N] float32): logit_bias entries
    # (row [M], token [M], until [M]): -inf while the row's output index < until
    banned: tuple | None = None
    # the penalties, in place on the logits: penalize() on Penalties, or the workers' slot kernels
    penalize: Callable[[torch.Tensor], None] | None = None
    # grammars: (row [C], bitmask [C, ceil(V / 32)] int32 or int64 words): -inf where a bit is 0
    allowed: tuple | None = None


def allowed_mask(bits: torch.Tensor, V: int) -> torch.Tensor:
    """Bitmask words [C, W] (bit t % 32 of word t // 32: token t allowed) -> [C, V] bool."""
    # (int64 words from the step buffer hold int32 values: half the temporaries)
    bits = bits.to(torch.int32)
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :V]


def edit(
    logits: torch.Tensor, e: LogitEdits, output_index: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """logits [B, V] float32 -> the edited logits (in place if asked: the caller no longer needs
    the raw ones). output_index [B]: which output token each row samples."""
    x = logits if inplace else logits.clone()
    if e.bias is not None:
        row, tok, value = e.bias
        x.index_put_((row, tok), value, accumulate=True)
    if e.banned is not None:  # (a token listed twice writes the same value twice)
        row, tok, until = e.banned
        x[row, tok] = torch.where(output_index[row] < until, float("-inf"), x[row, tok])
    if e.penalize is not None:
        e.penalize(x)
    if e.allowed is not None:  # last: nothing above can lift a token out of -inf
        row, bits = e.allowed
        x[row] = x[row].masked_fill(~allowed_mask(bits, x.shape[1]), float("-inf"))
    return x


def penalize(x: torch.Tensor, p: Penalties) -> None:
    """In place on x [B, V]: each listed token's logit l -> (l / r if l > 0 else l * r) - f * count
    - pr * (count > 0). Only the listed columns are touched: O(P x n), not O(P x V). A token listed
    twice (in the prompt and the outputs, or output twice) and the ignored entries (pointed at
    the first) write the same value each time."""
    valid = torch.arange(p.tokens.shape[1], device=x.device) < p.length.unsqueeze(1)
    tokens = torch.where(valid, p.tokens, p.tokens[:, :1])
    counts = torch.where(valid, p.counts, p.counts[:, :1])
    rows = p.rows.unsqueeze(1)
    raw = x[rows, tokens]
    r = p.repetition.unsqueeze(1)
    value = torch.where(raw > 0, raw / r, raw * r)
    value = value - p.frequency.unsqueeze(1) * counts - p.presence.unsqueeze(1) * (counts > 0)
    x[rows, tokens] = value


def sample(
    logits: torch.Tensor,
    p: SamplingTensors,
    greedy: bool | None = None,
    filtered: bool = True,
    bits_rows=random_bits_rows,
) -> torch.Tensor:
    """logits [B, V] (edited) -> token ids [B] (int64). What the caller knows saves device work and
    read-backs: greedy, every temperature is 0; filtered=False, no row uses top-k or top-p (no sort).
    bits_rows: the worker's random_bits_rows (rlt/models/ops.py)."""
    logits = logits.float()
    if greedy is None:
        greedy = bool((p.temperature == 0).all())
    if greedy:
        return logits.argmax(dim=-1)
    greedy = logits.argmax(dim=-1)
    scaled = logits / torch.where(p.temperature > 0, p.temperature, 1.0).unsqueeze(1)
    noise = gumbel_of(bits_rows(p.seed, STREAM_SAMPLING, p.output_index, logits.shape[1]))
    if p.min_p is not None:  # p < min_p * p_max, in log space (log 0 = -inf: off)
        floor = scaled.amax(dim=-1, keepdim=True) + p.min_p.log().unsqueeze(1)
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
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
    drop_sorted = (rank >= k) | (
        (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1) & (rank > 0)
    )
    return torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)


def top_logprobs(
    logits: torch.Tensor, k: int, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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
