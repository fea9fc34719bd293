"""OpenAI's request bodies -> rlt requests, and rlt outputs -> OpenAI's response objects.

A body is read field by field (no schema library): each known field maps onto SamplingParams, an
unknown field is ignored as OpenAI's server does, and every value is then checked by the engine
itself (rlt.RequestError names the field and the limit) before any worker sees the request.
"""

import time
import uuid
from dataclasses import dataclass

from rlt.errors import RequestError
from rlt.sampling_params import SamplingParams

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


def _int(body: dict, name: str, default=None):
    v = body.get(name, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(f"{name} must be an integer, got {v!r}")
    return v


def parse(body: dict, chat: bool) -> Parsed:
    """max_tokens stays None where the body has none and this is a chat (the caller fills in what
    the context leaves)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    kw = {k: body[k] for k in _SAME if body.get(k) is not None}
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    max_tokens = _int(body, "max_completion_tokens") if chat else None
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens")
    kw["max_tokens"] = 16 if max_tokens is None and not chat else max_tokens
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("logprobs are not served over HTTP yet (the Python API has them)")
    n = _int(body, "n", 1)
    if n < 1 or n > 128:
        raise RequestError(f"n must be in [1, 128], got {n}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise RequestError(f"stop must be a non-empty string or a list of at most 16 of them, got {body.get('stop')!r}")
    seed = kw.get("seed")
    params = [SamplingParams(**(kw | ({"seed": seed + i} if seed is not None and i else {}))) for i in range(n)]
    options = body.get("stream_options") or {}
    return Parsed(
        params,
        stop,
        bool(body.get("stream", False)),
        bool(options.get("include_usage", False)) if isinstance(options, dict) else False,
        bool(body.get("return_exit_depths", False)),
    )


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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def created() -> int:
    return int(time.time())


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
