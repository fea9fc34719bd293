"""OpenAI's request bodies -> rlt requests, and rlt outputs -> OpenAI's response objects.

A body is read field by field (no schema library): each known field maps onto SamplingParams, an
unknown field is ignored as OpenAI's server does, and every value is then checked by the engine
itself (rlt.RequestError names the field and the limit) before any worker sees the request.
"""

import time
import uuid
from dataclasses import dataclass

from rlt.errors import RequestError
from rlt.sampling_params import SamplingParams, choices

# OpenAI (and vLLM) names -> SamplingParams fields; the looped-model ones keep rlt's names.
_SAME = (
    "temperature",
    "top_p",
    "seed",
    "top_k",
    "stop_token_ids",
    "ignore_eos",
    "min_loops",
    "max_loops",
    "exit_threshold",
)
_FIELDS = {*_SAME, "max_tokens", "max_completion_tokens", "n", "stop", "logprobs", "top_logprobs", "prompt", "messages"}


@dataclass
class Parsed:
    """One request body: n choices of the same prompt."""

    params: list[SamplingParams]  # one per choice (each its own seed stream)
    stop: list[str]
    stream: bool
    include_usage: bool
    return_exit_depths: bool
    return_token_ids: bool  # vLLM's: prompt and generated token ids beside the text
    top_logprobs: int | None  # None: no logprobs


def _int(body: dict, name: str, default=None):
    v = body.get(name, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(f"{name} must be an integer, got {v!r}")
    return v


# generation_config.json fields a request's defaults come from (as vLLM's --generation-config auto)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "max_new_tokens")


def parse(body: dict, chat: bool, defaults: dict) -> Parsed:
    """defaults: generation_config.json's (GENERATION_DEFAULTS), for fields the body leaves out.
    max_tokens stays None where neither gives one and this is a chat (the caller fills in what the
    context leaves)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    kw = {k: v for k, v in defaults.items() if k in _SAME} | {k: body[k] for k in _SAME if body.get(k) is not None}
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    max_tokens = _int(body, "max_completion_tokens") if chat else None
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens")
    if max_tokens is None:
        max_tokens = defaults.get("max_new_tokens", None if chat else 16)
    kw["max_tokens"] = max_tokens
    top = None  # completions: logprobs (an int); chat: logprobs (a bool) and top_logprobs
    if chat and body.get("logprobs"):
        top = _int(body, "top_logprobs", 0) or 0
    elif chat and body.get("top_logprobs") is not None:
        raise RequestError("top_logprobs needs logprobs: true")
    elif not chat and body.get("logprobs") is not None:
        top = _int(body, "logprobs")
    if top is not None:
        if not 0 <= top <= 20:
            raise RequestError(f"{'top_logprobs' if chat else 'logprobs'} must be in [0, 20], got {top}")
        kw["logprobs"] = max(top, 1)  # (the engine's logprobs also carry the sampled token's)
    n = _int(body, "n", 1)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise RequestError(f"stop must be a non-empty string or a list of at most 16 of them, got {body.get('stop')!r}")
    params = choices(n, **kw)
    options = body.get("stream_options") or {}
    return Parsed(
        params,
        stop,
        bool(body.get("stream", False)),
        bool(options.get("include_usage", False)) if isinstance(options, dict) else False,
        bool(body.get("return_exit_depths", False)),
        bool(body.get("return_token_ids", False)),
        top,
    )


def logprobs(tokenizer, ids: list[int], positions: list[dict], top: int, chat: bool, offset: int) -> dict:
    """OpenAI's logprobs of these generated tokens: chat's `content` list, or the completions'
    tokens / token_logprobs / top_logprobs / text_offset (offsets from `offset`)."""
    text = (lambda i: tokenizer.decode([i])) if tokenizer is not None else str
    tops = [sorted(((t, lp) for t, lp in pos.items()), key=lambda x: -x[1])[:top] for pos in positions]
    if chat:
        entry = lambda t, lp: {"token": text(t), "logprob": lp, "bytes": list(text(t).encode())}  # noqa: E731
        return {
            "content": [
                entry(i, pos[i]) | {"top_logprobs": [entry(t, lp) for t, lp in tp]}
                for i, pos, tp in zip(ids, positions, tops)
            ]
        }
    tokens = [text(i) for i in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [pos[i] for i, pos in zip(ids, positions)],
        "top_logprobs": [{text(t): lp for t, lp in tp} for tp in tops] if top else None,
        "text_offset": offsets,
    }


def field_named(message: str) -> str | None:
    """The request field an error message starts with (rlt's errors name the field first)."""
    first = message.split(" ", 1)[0].strip("'\"")
    return first if first in _FIELDS else None


def find_stop(text: str, stop: list[str], start: int) -> int | None:
    """Where the first stop string begins in text, looking only at what could contain one that ends
    after `start` (the text already checked); None if none."""
    hits = [i for s in stop if (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},  # what the prefix cache held
    }


def created() -> int:
    return int(time.time())


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
