"""Grammar-constrained decoding with xgrammar (chosen over llguidance by measurement, issue 32), shared
by the coordinator (checks a request's grammar at the call) and the workers' compile processes.

A request's StructuredOutput becomes a spec, (kind, text), that travels in ResolvedParams and keys
the compiled-grammar caches. The tokenizer info covers the model's whole vocabulary: ids past the
tokenizer's are never allowed; the model's EOS ids are the grammar's stop tokens. A grammar may wait
for a token sequence in the output (`after`, e.g. the end of the reasoning) and start after it.

Every JSON a grammar produces is RFC 8259 JSON that Python's strict `json.loads` reads and whose
strings are valid UTF-8: xgrammar's length-bounded strings (minLength, maxLength) admit raw
U+0000-U+001F, and every string a UTF-16 surrogate (not UTF-8: it decodes to U+FFFD, and a
maxLength counted in codepoints no longer holds); their character classes are tightened in the
grammar's text (xgrammar prints a grammar as EBNF and reads it back). JSON is compact: no
whitespace but the one space after each `,` and `:` (as Python's json.dumps), so a weak model's
whitespace cannot run to max_tokens.

Size limits (EngineConfig's max_grammar_*, max_regex_length) are checked at the call, before any
worker work, each naming its field; what they cannot catch (a small regex with large repeats) is the
compile deadline's (rlt/workers/grammar_compile.py).
"""

import functools
import json
import re
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

from rlt.errors import RequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# a JSON string's characters as xgrammar 0.2.9 prints their classes (length-bounded strings', free
# ones'), and RFC 8259's: no control character, and no UTF-16 surrogate (xgrammar would take its
# 3-byte CESU form, which is not UTF-8: each byte decodes to U+FFFD)
_LAX_CHARS = (r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]")
_STRICT_CHARS = r"[^\0-\x1f\"\\\uD800-\uDFFF]"


def spec_of(so) -> tuple[str, str] | None:
    """A StructuredOutput (or None) -> its spec, shape-checked (RequestError naming the field)."""
    if so is None:
        return None
    from rlt.contract.sampling_params import StructuredOutput

    if not isinstance(so, StructuredOutput):
        raise RequestError(
            f"structured_output must be rlt.StructuredOutput, got {type(so).__name__}"
        )
    given = [k for k in KINDS if getattr(so, k) not in (None, False)]
    if len(given) != 1:
        raise RequestError(
            f"structured_output must set exactly one of {', '.join(KINDS)}; got {given or 'none'}"
        )
    kind, v = given[0], getattr(so, given[0])
    if kind in ("json", "structural_tag"):
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise RequestError(f"structured_output.{kind}: not JSON: {e}") from None
        if not isinstance(v, dict):
            raise RequestError(
                f"structured_output.{kind} must be a JSON object, got {type(v).__name__}"
            )
        return kind, json.dumps(v)  # (its property order is the output's)
    if kind == "json_object":
        if v is not True:
            raise RequestError(f"structured_output.json_object must be true, got {v!r}")
        return kind, ""
    if kind == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) and c for c in v):
            raise RequestError(
                f"structured_output.choice must be a non-empty list of non-empty strings, got {v!r}"
            )
        return kind, json.dumps(v)
    if not isinstance(v, str) or not v:
        raise RequestError(f"structured_output.{kind} must be a non-empty string, got {v!r}")
    return kind, v


def after_of(so, vocab_size: int) -> tuple[int, ...]:
    """StructuredOutput.after (a shape-checked spec's), checked: the token ids the grammar waits for."""
    v = None if so is None else so.after
    if v is None:
        return ()
    if (
        not isinstance(v, (list, tuple))
        or not v
        or not all(type(t) is int and 0 <= t < vocab_size for t in v)
    ):
        raise RequestError(
            f"structured_output.after must be a non-empty list of token ids in [0, {vocab_size}), got {v!r}"
        )
    return tuple(v)


def check_limits(spec: tuple[str, str], limits) -> None:
    """RequestError naming the field and the limit the spec passes (cheap: a walk of its JSON).
    limits: an EngineConfig (max_grammar_bytes, max_grammar_entries, max_regex_length)."""
    kind, text = spec
    field = f"structured_output.{kind}"
    if (n := len(text.encode())) > limits.max_grammar_bytes:
        raise RequestError(
            f"{field}: has {n} bytes, more than the limit {limits.max_grammar_bytes} (max_grammar_bytes)"
        )
    if kind == "regex" and len(text) > limits.max_regex_length:
        raise RequestError(
            f"{field}: has {len(text)} characters, more than the limit {limits.max_regex_length} (max_regex_length)"
        )
    entries = len(json.loads(text)) if kind == "choice" else 0
    if kind in ("json", "structural_tag"):
        for path, node in _nodes(json.loads(text), "$"):
            ref, enum, pattern = node.get("$ref"), node.get("enum"), node.get("pattern")
            if isinstance(ref, str) and not ref.startswith("#"):
                raise RequestError(
                    f"{field}: {path}.$ref {ref!r} is external: only local references (#...) resolve"
                )
            entries += len(enum) if isinstance(enum, list) else 0
            if isinstance(pattern, str) and len(pattern) > limits.max_regex_length:
                raise RequestError(
                    f"{field}: {path}.pattern has {len(pattern)} characters, more than the limit "
                    f"{limits.max_regex_length} (max_regex_length)"
                )
    if entries > limits.max_grammar_entries:
        raise RequestError(
            f"{field}: has {entries} enum and choice entries, more than the limit {limits.max_grammar_entries} "
            "(max_grammar_entries)"
        )


def _nodes(v, path: str):
    """Every object inside a JSON value, with its path ($.a.b[0])."""
    stack = [(path, v)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            yield path, v
            stack.extend((f"{path}.{k}", c) for k, c in v.items() if isinstance(c, (dict, list)))
        elif isinstance(v, list):
            stack.extend(
                (f"{path}[{i}]", c) for i, c in enumerate(v) if isinstance(c, (dict, list))
            )


def grammar_of(spec: tuple[str, str]):
    """A spec -> xgrammar's Grammar: its structure alone, no tokenizer (well under a millisecond for a
    6-field schema; the compile against the vocabulary is the workers')."""
    import xgrammar as xgr

    kind, text = spec
    if kind == "json":
        return strict(xgr.Grammar.from_json_schema(text, any_whitespace=False))
    if kind == "json_object":  # any object (not strict: any properties)
        return strict(
            xgr.Grammar.from_json_schema(
                '{"type": "object"}', any_whitespace=False, strict_mode=False
            )
        )
    if kind == "structural_tag":  # (its JSON contents compact and strict as any other's)
        return strict(xgr.Grammar.from_structural_tag(_compact_contents(json.loads(text))))
    if kind == "regex":
        return xgr.Grammar.from_regex(text)
    # (JSON's string escapes are EBNF's; json.dumps's own, without its overhead per call)
    if kind == "choice":
        return xgr.Grammar.from_ebnf(
            "root ::= " + " | ".join(map(encode_basestring_ascii, json.loads(text)))
        )
    return xgr.Grammar.from_ebnf(text)


def strict(grammar):
    """A JSON grammar whose length-bounded strings admit no raw control character (module doc)."""
    import xgrammar as xgr

    text = str(grammar)
    if not any(lax in text for lax in _LAX_CHARS):
        return grammar
    for lax in _LAX_CHARS:
        text = text.replace(lax, _STRICT_CHARS)
    return xgr.Grammar.from_ebnf(text)


def _compact_contents(v):
    """A structural tag whose `json_schema` contents become their compact, strict grammars."""
    if isinstance(v, list):
        return [_compact_contents(c) for c in v]
    if not isinstance(v, dict):
        return v
    if (
        v.get("type") == "json_schema"
        and v.get("style", "json") == "json"
        and not v.get("excludes")
    ):
        return {
            "type": "grammar",
            "grammar": str(grammar_of(("json", json.dumps(v.get("json_schema"))))),
        }
    return {k: _compact_contents(c) for k, c in v.items()}


def error_text(spec: tuple[str, str], e: Exception) -> str:
    """xgrammar's RuntimeError("[time] file.cc:line: message") -> the message, naming the field."""
    msg = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    return f"structured_output.{spec[0]}: {msg}"


@functools.lru_cache(maxsize=256)
def _problem(spec: tuple[str, str], limits: tuple[int, int, int]) -> str | None:
    try:
        check_limits(spec, _Limits(*limits))
        grammar_of(spec)
    except RequestError as e:
        return str(e)
    except Exception as e:
        return error_text(spec, e)
    return None


class _Limits(NamedTuple):
    max_grammar_bytes: int
    max_grammar_entries: int
    max_regex_length: int


def check(spec: tuple[str, str], cfg) -> None:
    """The coordinator's check at the call: RequestError naming the field if the spec passes a limit
    (cfg: an EngineConfig's max_grammar_*) or is not a grammar (its structure, no tokenizer). Cached:
    rlt serve runs it in its thread pool first, so its event loop finds the answer."""
    limits = _Limits(cfg.max_grammar_bytes, cfg.max_grammar_entries, cfg.max_regex_length)
    if (problem := _problem(spec, limits)) is not None:
        raise RequestError(problem)
