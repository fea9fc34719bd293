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
from rlt.serve.errors import short
from rlt.serve.limits import check_ids, check_text

# OpenAI (and vLLM) names -> SamplingParams fields; the looped-model ones keep rlt's names. Each is
# checked for its JSON type here (null: the default), its value then by the engine.
_NUMBERS = ("temperature", "top_p", "exit_threshold")
_INTS = ("seed", "top_k", "min_loops", "max_loops")
_SAME = (*_NUMBERS, *_INTS, "stop_token_ids", "ignore_eos")
_BOOLS = ("stream", "return_exit_depths", "return_token_ids", "stream_options.include_usage")
_FIELDS = {*_SAME, *_BOOLS, "max_tokens", "max_completion_tokens", "n", "stop", "logprobs", "top_logprobs"}
_FIELDS |= {"prompt", "messages", "stream_options", "model"}
INT64 = (-(2**63), 2**63 - 1)


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
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not INT64[0] <= v <= INT64[1]:
        raise RequestError(f"{name} must be an integer in [-2**63, 2**63), got {short(v)}")
    return v


def _number(body: dict, name: str):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RequestError(f"{name} must be a number, got {short(v)}")
    try:
        return float(v)  # (an integer of 400 digits is past float range)
    except OverflowError:
        raise RequestError(f"{name} must be a number in float range, got {short(v)}") from None


def _bool(body: dict, name: str, label: str | None = None) -> bool:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise RequestError(f"{label or name} must be true or false, got {short(v)}")
    return bool(v)


def _token_ids(body: dict, name: str) -> list[int] | None:
    v = body.get(name)
    if v is not None and not (isinstance(v, list) and all(type(t) is int for t in v)):
        raise RequestError(f"{name} must be a list of token ids, got {short(v)}")
    return v


# generation_config.json fields a request's defaults come from (as vLLM's --generation-config auto)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "max_new_tokens")


def parse(body: dict, chat: bool, defaults: dict) -> Parsed:
    """defaults: generation_config.json's (GENERATION_DEFAULTS), for fields the body leaves out.
    max_tokens stays None where neither gives one and this is a chat (the caller fills in what the
    context leaves)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    given = {k: _number(body, k) for k in _NUMBERS} | {k: _int(body, k) for k in _INTS}
    given |= {"stop_token_ids": _token_ids(body, "stop_token_ids"), "ignore_eos": _bool(body, "ignore_eos")}
    kw = {k: v for k, v in defaults.items() if k in _SAME} | {k: v for k, v in given.items() if v is not None}
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    max_tokens = _int(body, "max_completion_tokens") if chat else None
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens")
    if max_tokens is None:
        max_tokens = defaults.get("max_new_tokens", None if chat else 16)
    kw["max_tokens"] = max_tokens
    top = None  # completions: logprobs (an int); chat: logprobs (a bool) and top_logprobs
    if chat and _bool(body, "logprobs"):
        top = _int(body, "top_logprobs", 0)
    elif chat and body.get("top_logprobs") is not None:
        raise RequestError("top_logprobs needs logprobs: true")
    elif not chat:
        top = _int(body, "logprobs")
    if top is not None:
        if not 0 <= top <= 20:
            raise RequestError(f"{'top_logprobs' if chat else 'logprobs'} must be in [0, 20], got {top}")
        kw["logprobs"] = max(top, 1)  # (the engine's logprobs also carry the sampled token's)
    n = _int(body, "n", 1)
    stop = body.get("stop")
    stop = [] if stop is None or stop == "" else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise RequestError(f"stop must be a non-empty string or a list of at most 16 of them, got {short(stop)}")
    params = choices(n, **kw)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {short(options)}")
    return Parsed(
        params,
        stop,
        _bool(body, "stream"),
        _bool(options or {}, "include_usage", "stream_options.include_usage"),
        _bool(body, "return_exit_depths"),
        _bool(body, "return_token_ids"),
        top,
    )


def render_chat(engine, messages) -> list[int]:
    """The conversation through the checkpoint's own chat template, ending in the assistant's turn;
    a template that writes the BOS itself does not get a second one from the tokenizer. In the pool
    (rendering and tokenizing a long chat takes a while)."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("messages must be a non-empty list of objects")
    max_positions = engine.model_config.max_positions
    if len(messages) > max_positions:  # every message renders at least one token
        raise RequestError(f"messages has {len(messages)} entries, more than the model's max positions {max_positions}")
    tok = engine.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise RequestError("this model has no chat template: use /v1/completions")
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - a template error is the request's
        raise RequestError(f"messages cannot be rendered: {type(e).__name__}: {e}") from None
    check_text(text, "messages", max_positions)
    ids = tok(text).input_ids
    bos = engine.model_config.bos_token_id
    if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    check_ids(ids, "messages", max_positions)
    return ids


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
