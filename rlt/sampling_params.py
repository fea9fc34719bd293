"""SamplingParams: what a request asks for. Defaults follow vLLM (temperature 1.0, max_tokens 16)."""

import msgspec


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
    logprobs: int | None = None  # top-K logprobs per output position
