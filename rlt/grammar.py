"""Grammar-constrained decoding with xgrammar (chosen by measurement: scripts/grammar_bench.py), shared
by the coordinator (checks a request's grammar at the call) and the workers (compile and match).

A request's StructuredOutput becomes a spec, (kind, text), that travels in ResolvedParams and keys
the compiled-grammar caches. The tokenizer info covers the model's whole vocabulary: ids past the
tokenizer's are never allowed; the model's EOS ids are the grammar's stop tokens. A grammar may wait
for a token sequence in the output (`after`, e.g. the end of the reasoning) and start after it.
"""

import functools
import json
import re

from rlt.errors import RequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object")


def spec_of(so) -> tuple[str, str] | None:
    """A StructuredOutput (or None) -> its spec, shape-checked (RequestError naming the field)."""
    if so is None:
        return None
    from rlt.sampling_params import StructuredOutput

    if not isinstance(so, StructuredOutput):
        raise RequestError(f"structured_output must be rlt.StructuredOutput, got {type(so).__name__}")
    given = [k for k in KINDS if getattr(so, k) not in (None, False)]
    if len(given) != 1:
        raise RequestError(f"structured_output must set exactly one of {', '.join(KINDS)}; got {given or 'none'}")
    kind, v = given[0], getattr(so, given[0])
    if kind == "json":
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise RequestError(f"structured_output.json: not JSON: {e}") from None
        if not isinstance(v, dict):
            raise RequestError(f"structured_output.json must be a JSON schema object, got {type(v).__name__}")
        return kind, json.dumps(v)  # (its property order is the output's)
    if kind == "json_object":
        if v is not True:
            raise RequestError(f"structured_output.json_object must be true, got {v!r}")
        return kind, ""
    if kind == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) and c for c in v):
            raise RequestError(f"structured_output.choice must be a non-empty list of non-empty strings, got {v!r}")
        return kind, json.dumps(v)
    if not isinstance(v, str) or not v:
        raise RequestError(f"structured_output.{kind} must be a non-empty string, got {v!r}")
    return kind, v


def after_of(so, vocab_size: int) -> tuple[int, ...]:
    """StructuredOutput.after (a shape-checked spec's), checked: the token ids the grammar waits for."""
    v = None if so is None else so.after
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)) or not v or not all(type(t) is int and 0 <= t < vocab_size for t in v):
        raise RequestError(
            f"structured_output.after must be a non-empty list of token ids in [0, {vocab_size}), got {v!r}"
        )
    return tuple(v)


def grammar_of(spec: tuple[str, str]):
    """A spec -> xgrammar's Grammar: its structure alone, no tokenizer (well under a millisecond for a
    6-field schema; the compile against the vocabulary is the workers')."""
    import xgrammar as xgr

    kind, text = spec
    # JSON compact (no free whitespace: a weak model's whitespace could otherwise run to max_tokens)
    if kind == "json":
        return xgr.Grammar.from_json_schema(text, any_whitespace=False)
    if kind == "json_object":  # any object (not strict: any properties)
        return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return xgr.Grammar.from_regex(text)
    if kind == "choice":  # (JSON's string escapes are EBNF's)
        return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(s) for s in json.loads(text)))
    return xgr.Grammar.from_ebnf(text)


def error_text(spec: tuple[str, str], e: Exception) -> str:
    """xgrammar's RuntimeError("[time] file.cc:line: message") -> the message, naming the field."""
    msg = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    return f"structured_output.{spec[0]}: {msg}"


@functools.lru_cache(maxsize=1024)
def _problem(spec: tuple[str, str]) -> str | None:
    try:
        grammar_of(spec)
    except Exception as e:
        return error_text(spec, e)
    return None


def check(spec: tuple[str, str]) -> None:
    """The coordinator's check at the call: RequestError naming the field if the spec is not a grammar
    (its structure: cheap, and cached, so the event loop never waits for a compile)."""
    if (problem := _problem(spec)) is not None:
        raise RequestError(problem)


class Grammars:
    """Compiles specs against one tokenizer (xgrammar's compiler caches them by text)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        import xgrammar as xgr

        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids)
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_limit_bytes=256 << 20)

    def compile(self, spec: tuple[str, str]):
        return self.compiler.compile_grammar(grammar_of(spec))
