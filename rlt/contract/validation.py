"""Request validation against the ModelConfig, before any worker sees the request."""

import math
import secrets

from rlt.contract.grammar import after_of, spec_of
from rlt.contract.sampling_params import EXIT_CRITERIA, ResolvedParams, SamplingParams
from rlt.errors import RequestError
from rlt.models.model_config import ModelConfig

INT64 = (-(2**63), 2**63 - 1)  # what msgpack and the workers' int64 tensors carry
MAX_LOGPROBS = 20  # prompt_logprobs' top-K (vLLM's default max_logprobs)
MAX_LOGIT_BIAS = 1024  # logit_bias entries
MAX_STOP = 16  # stop strings
MAX_CHOICES = 128  # n
MAX_SPECULATIVE_TOKENS = 16  # a speculation round's drafts


def _int(name, v, lo=None, hi=None, lo_text=None, hi_text=None):
    if not isinstance(v, int) or isinstance(v, bool):
        raise RequestError(f"{name} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise RequestError(f"{name} must be >= {lo_text or lo}, got {v}")
    if hi is not None and v > hi:
        raise RequestError(f"{name} must be <= {hi_text or hi}, got {v}")
    return v


def _float(name, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise RequestError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def validate_prompt(mc: ModelConfig, prompt_token_ids) -> list[int]:
    if not isinstance(prompt_token_ids, (list, tuple)) or len(prompt_token_ids) == 0:
        raise RequestError("prompt must be a non-empty text or list of token ids")
    V, ids = mc.vocab_size, list(prompt_token_ids)
    # (C loops: ~20x the loop below)
    if set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < V:
        return ids
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < V:
            raise RequestError(
                f"prompt token id {t!r} at index {i} is outside the vocabulary [0, {V})"
            )
    return ids


def validate_priority(priority) -> int:
    """Lower runs first (FCFS among equals)."""
    return _int("priority", priority, *INT64)


def resolve_params(mc: ModelConfig, prompt_len: int, p: SamplingParams) -> ResolvedParams:
    if not isinstance(p, SamplingParams):
        raise RequestError(f"sampling params must be rlt.SamplingParams, got {type(p).__name__}")
    depth, V = mc.depth, mc.vocab_size
    max_tokens = _int("max_tokens", p.max_tokens, lo=1)
    if prompt_len + max_tokens > mc.max_positions:
        raise RequestError(
            f"prompt length {prompt_len} + max_tokens {max_tokens} exceeds the model's max positions {mc.max_positions}"
        )
    temperature = _float("temperature", p.temperature)
    if temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {temperature}")
    top_k = _int("top_k", p.top_k, lo=-1, hi=INT64[1])
    top_p = _float("top_p", p.top_p)
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}")
    if p.seed is not None:
        _int("seed", p.seed, *INT64)
    max_loops = (
        depth
        if p.max_loops is None
        else _int("max_loops", p.max_loops, lo=1, hi=depth, hi_text=f"the model's depth {depth}")
    )
    min_loops = (
        1
        if p.min_loops is None
        else _int("min_loops", p.min_loops, lo=1, hi=max_loops, hi_text=f"max_loops ({max_loops})")
    )
    criterion, thr = _exit_rule(mc, p)
    if not isinstance(p.stop_token_ids, (list, tuple)):
        raise RequestError(f"stop_token_ids must be a list of token ids, got {p.stop_token_ids!r}")
    for t in p.stop_token_ids:
        _int("stop_token_ids entry", t, lo=0, hi=V - 1, hi_text=f"vocab size - 1 ({V - 1})")
    if not isinstance(p.ignore_eos, bool):
        raise RequestError(f"ignore_eos must be a bool, got {p.ignore_eos!r}")
    logprobs = (
        0
        if p.logprobs is None
        else _int("logprobs", p.logprobs, lo=0, hi=V, hi_text=f"vocab size ({V})")
    )
    prompt_logprobs = (
        None
        if p.prompt_logprobs is None
        else _int("prompt_logprobs", p.prompt_logprobs, 0, MAX_LOGPROBS)
    )
    rp = ResolvedParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=max(top_k, 0),
        top_p=top_p,
        sampling_seed=p.seed if p.seed is not None else secrets.randbits(63),
        state_seed=p.seed if p.seed is not None else 0,
        min_loops=min_loops,
        max_loops=max_loops,
        exit_threshold=thr,
        exit_criterion=criterion,
        stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        repetition_penalty=_in("repetition_penalty", p.repetition_penalty, 0, None, low_open=True),
        presence_penalty=_in("presence_penalty", p.presence_penalty, -2, 2),
        frequency_penalty=_in("frequency_penalty", p.frequency_penalty, -2, 2),
        min_p=_in("min_p", p.min_p, 0, 1),
        logit_bias=_logit_bias(p.logit_bias, V),
        min_tokens=_int(
            "min_tokens", p.min_tokens, lo=0, hi=max_tokens, hi_text=f"max_tokens ({max_tokens})"
        ),
        # (compiled against the tokenizer by the caller)
        structured_output=spec_of(p.structured_output),
        grammar_after=after_of(p.structured_output, V),
        speculative_loops=_speculative_loops(mc, p.speculative_loops, max_loops),
        speculative_tokens=None
        if p.speculative_tokens is None
        else _int("speculative_tokens", p.speculative_tokens, lo=1, hi=MAX_SPECULATIVE_TOKENS),
    )
    if rp.speculative_loops and (rp.exits_early or rp.penalized):
        why = "exit early" if rp.exits_early else "a penalty"
        raise RequestError(
            f"speculative_loops {rp.speculative_loops}: self-speculation needs a fixed depth and no penalties; "
            f"this request has {why} (set speculative_loops 0, or leave it to the engine: it speculates only "
            "where it can)"
        )
    return rp


def _speculative_loops(mc: ModelConfig, loops, max_loops: int) -> int | None:
    if loops is None:
        return None
    _int(
        "speculative_loops",
        loops,
        lo=0,
        hi=max_loops - 1,
        hi_text=f"max_loops - 1 ({max_loops - 1})",
    )
    return loops


def _exit_rule(mc: ModelConfig, p: SamplingParams) -> tuple[str, float]:
    """(exit_criterion, exit_threshold): the threshold is read per criterion."""
    crit = "gate" if p.exit_criterion is None else p.exit_criterion
    if p.exit_criterion == "gate" and mc.has_exit_criteria:
        raise RequestError(
            f"exit_criterion 'gate' is Ouro's learned exit gate; this model ({mc.model_type}) has none: "
            f"its criteria are {', '.join(EXIT_CRITERIA)}"
        )
    if crit == "gate":
        thr = (
            mc.default_exit_threshold
            if p.exit_threshold is None
            else _float("exit_threshold", p.exit_threshold)
        )
        if not 0 <= thr <= 1:
            raise RequestError(f"exit_threshold must be in [0, 1], got {thr}")
        # no gate, no hazard: the family runs max_loops whatever the threshold
        return crit, thr if mc.has_exit_gate else 1.0
    if not isinstance(crit, str) or crit not in EXIT_CRITERIA:
        raise RequestError(
            f"exit_criterion must be one of gate, {', '.join(EXIT_CRITERIA)}; got {crit!r}"
        )
    if not mc.has_exit_criteria:
        raise RequestError(
            f"exit_criterion {crit!r} is for Huginn models; this one ({mc.model_type}) exits by 'gate'"
        )
    if p.exit_threshold is None:
        return crit, float(EXIT_CRITERIA[crit])
    thr = _float("exit_threshold", p.exit_threshold)
    if crit == "argmax-stability" and (thr != int(thr) or thr < 1):
        raise RequestError(
            f"exit_threshold of argmax-stability counts checks: an integer >= 1, got {thr}"
        )
    if thr <= 0:
        raise RequestError(f"exit_threshold of {crit} must be > 0, got {thr}")
    return crit, thr


def _in(name, v, lo, hi, low_open=False) -> float:
    v = _float(name, v)
    if (v <= lo if low_open else v < lo) or (hi is not None and v > hi):
        limit = f"> {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise RequestError(f"{name} must be {limit}, got {v}")
    return v


def _logit_bias(bias, V: int) -> dict[int, float]:
    if not isinstance(bias, dict):
        raise RequestError(
            f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}"
        )
    if len(bias) > MAX_LOGIT_BIAS:
        raise RequestError(f"logit_bias has {len(bias)} entries, more than {MAX_LOGIT_BIAS}")
    out = {}
    for t, b in bias.items():
        _int("logit_bias token id", t, lo=0, hi=V - 1, hi_text=f"vocab size - 1 ({V - 1})")
        out[t] = _in(f"logit_bias[{t}]", b, -100, 100)
    return dict(sorted(out.items()))


def output_options(p: SamplingParams) -> tuple[int, list[str]]:
    """What the coordinator does with a request's outputs, checked: (n, stop strings)."""
    n = _int("n", p.n, lo=1, hi=MAX_CHOICES)
    stop = [p.stop] if isinstance(p.stop, str) else p.stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"stop must be a non-empty string or a list of them, got {p.stop!r}")
    if len(stop) > MAX_STOP:
        raise RequestError(f"stop has {len(stop)} strings, more than {MAX_STOP}")
    for name in ("include_stop_str_in_output", "skip_special_tokens"):
        if not isinstance(getattr(p, name), bool):
            raise RequestError(f"{name} must be a bool, got {getattr(p, name)!r}")
    return n, list(stop)
