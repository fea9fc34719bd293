"""SamplingParams: what a request asks for (defaults follow vLLM: temperature 1.0, max_tokens 16), and
ResolvedParams: the same with every default filled in, as the coordinator validated it."""

import msgspec

from rlt.errors import RequestError


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = -1  # -1 or 0 = off
    top_p: float = 1.0
    seed: int | None = None
    min_loops: int | None = None  # None = 1
    max_loops: int | None = None  # None = the model's depth
    exit_threshold: float | None = None  # None = config.json's early_exit_threshold (Ouro); fixed depth otherwise
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None  # top-K logprobs per output position (and the sampled token's)


MAX_CHOICES = 128


def choices(n, **fields) -> list[SamplingParams]:
    """n choices of one request (OpenAI's `n`): choice i samples with seed + i, so each is its own
    seed stream and equals a separate request with that seed."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"n must be in [1, {MAX_CHOICES}], got {n!r}")
    seed = fields.get("seed")
    return [SamplingParams(**(fields | ({"seed": seed + i} if seed is not None and i else {}))) for i in range(n)]


class ResolvedParams(msgspec.Struct, frozen=True, kw_only=True):
    """SamplingParams with every default filled in; what a worker runs (and what travels to it)."""

    max_tokens: int
    temperature: float
    top_k: int  # 0 = off
    top_p: float
    sampling_seed: int  # a random one when the request gave none
    state_seed: int  # Huginn's initial latent: the request's seed, else 0 (deterministic by default)
    min_loops: int
    max_loops: int
    exit_threshold: float  # >= 1.0 means fixed depth (max_loops); gate-less families never exit early
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    logprobs: int  # 0 = none
