"""The bodies of /v1/completions and /v1/chat/completions as typed models, one per endpoint, each
converting to rlt.SamplingParams (as vLLM's to_sampling_params).

Every field of OpenAI's and vLLM's request schemas is implemented, accepted because it never
changes the output (`user`, `metadata`, `store`, `service_tier`, ...), or refused with a 400 naming
it unless its value asks for nothing (`best_of: 1`, `use_beam_search: false`); a grammar's fields
become SamplingParams.structured_output (rlt/serve/structured.py); a field neither defines is a 400
naming it, as OpenAI answers. Types are strict (no "1" for 1, no true for 1; null is the default);
values are then checked by the engine, whose errors name the field and the limit.
"""

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from rlt.contract.sampling_params import SamplingParams
from rlt.contract.validation import INT64
from rlt.errors import RequestError
from rlt.frontends.parsers import Parsing
from rlt.serve import structured
from rlt.serve.errors import HTTPError, short

Int = Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])]  # what the engine carries


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None  # a last chunk with the usage
    continuous_usage_stats: bool | None = None  # vLLM's: the usage so far in every chunk
    # OpenAI's padding against length side channels: none here
    include_obfuscation: bool | None = None


class _Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    # ---- sampling (rlt.SamplingParams, the engine checks each value) -----------------------------
    max_tokens: Int | None = None
    n: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int | None = None
    min_p: float | None = None
    seed: Int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool | None = None
    min_tokens: Int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    prompt_logprobs: Int | None = None
    min_loops: Int | None = None  # rlt's loop controls
    max_loops: Int | None = None
    exit_threshold: float | None = None
    # gate, or Huginn's latent-diff, cosine, kl, ... (SamplingParams)
    exit_criterion: str | None = None
    speculative_loops: Int | None = None  # self-speculation (0: off for this request)
    speculative_tokens: Int | None = None
    # ---- the request and its response ------------------------------------------------------------
    priority: Int | None = None  # lower runs first
    truncate_prompt_tokens: Int | None = None  # keep the prompt's last k tokens
    add_special_tokens: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    echo: bool | None = None
    return_exit_depths: bool | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    request_id: str | None = None  # vLLM's: the response's id
    # ---- accepted: they never change the output --------------------------------------------------
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # ---- a grammar (rlt/serve/structured.py: one source at most) ---------------------------------
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None  # the engine's (xgrammar) or auto
    guided_whitespace_pattern: Any = None  # refused: the engine's JSON is compact
    # ---- refused unless they ask for nothing (REFUSED) -------------------------------------------
    best_of: Int | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    allowed_token_ids: list[Int] | None = None
    bad_words: list[str] | None = None
    spaces_between_special_tokens: bool | None = None
    logits_processors: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None


class CompletionRequest(_Request):
    prompt: Any  # a text, token ids, or a list of either (rlt/serve/limits.py checks it)
    logprobs: Int | None = None  # top-K per position
    suffix: str | None = None
    prompt_embeds: Any = None


class ChatRequest(_Request):
    messages: Any  # rendered by the checkpoint's chat template (rlt/serve/chat.py checks them)
    max_completion_tokens: Int | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    documents: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None  # false: the first tool call only
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    include_reasoning: bool | None = None
    reasoning_effort: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    mm_processor_kwargs: Any = None


_NOTHING = lambda v, r: False  # noqa: E731 - any value asks for something
REFUSED: dict[str, tuple] = {  # field: (does this value ask for nothing?, why it is refused)
    "best_of": (
        lambda v, r: v == (r.n or 1),
        "best_of (ranking more candidates than n) is not supported: use n",
    ),
    "use_beam_search": (lambda v, r: not v, "beam search is not supported"),
    "length_penalty": (
        lambda v, r: v == 1.0,
        "length_penalty applies to beam search, which is not supported",
    ),
    "allowed_token_ids": (_NOTHING, "allowed_token_ids is not supported: use logit_bias"),
    "bad_words": (lambda v, r: not v, "bad_words is not supported: use logit_bias"),
    "spaces_between_special_tokens": (
        lambda v, r: v,
        "false is not supported (fast tokenizers put no spaces)",
    ),
    "logits_processors": (lambda v, r: not v, "custom logits processors are not supported"),
    "cache_salt": (_NOTHING, "cache_salt (prefix cache isolation) is not supported"),
    "kv_transfer_params": (
        _NOTHING,
        "kv_transfer_params is not supported: rlt moves KV itself (--topology)",
    ),
    "vllm_xargs": (lambda v, r: not v, "vllm_xargs is not supported"),
    "suffix": (lambda v, r: v == "", "suffix (fill-in-the-middle) is not supported"),
    "prompt_embeds": (_NOTHING, "prompt_embeds is not supported: give text or token ids"),
    "functions": (lambda v, r: not v, "function calling is not supported"),
    "function_call": (lambda v, r: v in ("none", "auto"), "function calling is not supported"),
    "reasoning_effort": (_NOTHING, "reasoning_effort is not supported"),
    "audio": (_NOTHING, "audio output is not supported"),
    "modalities": (lambda v, r: v == ["text"], "only the text modality is supported"),
    "prediction": (_NOTHING, "predicted outputs are not supported"),
    "web_search_options": (_NOTHING, "web search is not supported"),
    "verbosity": (_NOTHING, "verbosity is not supported"),
    "mm_processor_kwargs": (lambda v, r: not v, "multimodal inputs are not supported"),
}
FIELDS = frozenset(f for cls in (CompletionRequest, ChatRequest) for f in cls.__struct_fields__)

# generation_config.json fields a request's defaults come from (as vLLM's --generation-config auto)
GENERATION_DEFAULTS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
)
# body fields that are SamplingParams fields of the same name
_SAME = (
    *(
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "n",
        "stop_token_ids",
        "ignore_eos",
        "min_tokens",
    ),
    *("repetition_penalty", "presence_penalty", "frequency_penalty", "include_stop_str_in_output"),
    *(
        "skip_special_tokens",
        "prompt_logprobs",
        "min_loops",
        "max_loops",
        "exit_threshold",
        "exit_criterion",
    ),
    *("speculative_loops", "speculative_tokens"),
)


@dataclass
class Options:
    """What the server does with a request beyond its SamplingParams."""

    stream: bool
    include_usage: bool
    continuous_usage: bool
    echo: bool
    zero_tokens: bool  # echo with max_tokens 0: the prompt alone (one token runs, for its logprobs)
    top_logprobs: int | None  # logprobs shown per position (None: none)
    prompt_logprobs: int | None  # vLLM's prompt_logprobs, as asked (None: not asked)
    return_exit_depths: bool
    return_token_ids: bool
    tokens_as_ids: bool  # logprobs' tokens as "token_id:N" (vLLM's return_tokens_as_token_ids)
    priority: int
    truncate_prompt_tokens: int | None
    add_special_tokens: bool
    id: str | None
    # a chat's reasoning and tool-call parsing (rlt/frontends/parsers.py)
    parsing: Parsing | None = None
    # the field the request's grammar came from (its errors name it)
    grammar_field: str | None = None


def parse(body: dict, cls: type[_Request]) -> _Request:
    """The body as cls: a wrong type, a missing field or an unknown one is a 400 naming it."""
    try:
        req = msgspec.convert(body, cls)
    except msgspec.ValidationError as e:
        text = str(e)
        message, _, where = text.partition(" - at `$.")
        # ("stream_options.include_usage")
        field = where.split("`")[0].split("[")[0] if where else None
        # "... unknown field `x`", "... required field `x`"
        named = message.split("`")[1] if "`" in message else None
        if named is not None and message.startswith("Object"):  # (inside an object: its path first)
            field, where = f"{field}.{named}" if field else named, ""
        if message.startswith("Object contains unknown field"):
            message = f"{field} is not a field of this endpoint"
        raise HTTPError(
            400, f"{where.rstrip('`')}: {message}" if where else message, param=field
        ) from None
    for name, (asks_nothing, why) in REFUSED.items():
        v = getattr(req, name, None)
        if v is not None and not asks_nothing(v, req):
            raise HTTPError(400, f"{name} {short(v)}: {why}", param=name)
    return req


def to_sampling_params(req: _Request, chat: bool, defaults: dict) -> tuple[SamplingParams, Options]:
    """defaults: generation_config.json's (GENERATION_DEFAULTS), for fields the body leaves out.
    max_tokens stays None where neither gives one and this is a chat (the caller fills in what the
    context leaves)."""
    kw = {k: v for k, v in defaults.items() if k in _SAME}
    kw |= {k: v for k in _SAME if (v := getattr(req, k)) is not None}
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    if req.stop is not None:
        kw["stop"] = [] if req.stop == "" else [req.stop] if isinstance(req.stop, str) else req.stop
    if req.logit_bias:
        kw["logit_bias"] = _logit_bias(req.logit_bias)
    max_tokens = req.max_completion_tokens if chat else None
    max_tokens = max_tokens if max_tokens is not None else req.max_tokens
    if max_tokens is None:
        max_tokens = defaults.get("max_new_tokens", None if chat else 16)
    echo = bool(req.echo)
    zero = not chat and echo and max_tokens == 0
    if zero:  # (legacy OpenAI: the prompt and its logprobs, nothing generated)
        max_tokens = 1
    kw["max_tokens"] = max_tokens
    if chat and req.logprobs:
        top = req.top_logprobs or 0
    elif chat and req.top_logprobs is not None:
        raise RequestError("top_logprobs needs logprobs: true")
    else:
        top = None if chat else req.logprobs
    if top is not None:
        if not 0 <= top <= 20:
            raise RequestError(
                f"{'top_logprobs' if chat else 'logprobs'} must be in [0, 20], got {top}"
            )
        kw["logprobs"] = max(top, 1)  # (the engine's logprobs also carry the sampled token's)
        if echo and not chat:  # the prompt's logprobs too, first None (lm-eval's loglikelihood)
            kw["prompt_logprobs"] = max(top, kw.get("prompt_logprobs") or 0)
    kw["structured_output"], source = structured.of(req, chat)
    so = req.stream_options or StreamOptions()
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options needs stream: true")
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens < 1:
        raise RequestError(f"truncate_prompt_tokens must be >= 1, got {req.truncate_prompt_tokens}")
    options = Options(
        stream=bool(req.stream),
        include_usage=bool(so.include_usage),
        continuous_usage=bool(so.continuous_usage_stats),
        echo=echo,
        zero_tokens=zero,
        top_logprobs=top,
        prompt_logprobs=req.prompt_logprobs,
        return_exit_depths=bool(req.return_exit_depths),
        return_token_ids=bool(req.return_token_ids),
        tokens_as_ids=bool(req.return_tokens_as_token_ids),
        priority=req.priority or 0,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        add_special_tokens=req.add_special_tokens
        if req.add_special_tokens is not None
        else not chat,
        id=req.request_id,
        grammar_field=source,
    )
    return SamplingParams(**kw), options


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    out = {}
    for key, b in bias.items():
        if not key.isdigit() or len(key) > 19:
            raise RequestError(f"logit_bias keys must be token ids, got {short(key)}")
        out[int(key)] = b
    return out


def field_named(message: str) -> str | None:
    """The request field an error message starts with (rlt's errors name the field first)."""
    first = message.split(" ", 1)[0].strip("'\"").split("[")[0]
    return first if first in FIELDS else None
