"""xgrammar vs llguidance on this host's CPU: tokenizer setup, compile of a 6-field JSON schema and of
a regex, and the per-token mask fill while a sample walks the grammar (issue 32's choice).

    python scripts/grammar_bench.py [--vocab 1024 49152 65536]

Each vocabulary is a byte-level BPE tokenizer made by rlt's checkpoint maker (merges from the
embedded corpus, then filler tokens up to the size), loaded through transformers as rlt loads any.
"""

import argparse
import json
import statistics
import tempfile
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "score", "active"],
    "additionalProperties": False,
}
REGEX = r"(\+1 )?\(?[0-9]{3}\)?[ -][0-9]{3}-[0-9]{4}"
SAMPLE = (
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@math.com", "tags": ["a", "bb"], "score": 9.5, "active": true}'
)


def tokenizer(vocab: int):
    from transformers import AutoTokenizer

    from rlt.models.family import BY_NAME
    from rlt.models.tokenizer import train_tokenizer

    d = tempfile.mkdtemp()
    train_tokenizer(BY_NAME["ouro"].tokenizer, vocab, d)
    return AutoTokenizer.from_pretrained(d)


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


def bench_xgrammar(tok, vocab, ids):
    import torch
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup = ms(t0)
    t0 = time.perf_counter()
    cg = compiler.compile_json_schema(json.dumps(SCHEMA))
    c_json = ms(t0)
    t0 = time.perf_counter()
    compiler.compile_regex(REGEX)
    c_regex = ms(t0)
    m = xgr.GrammarMatcher(cg)
    mask = xgr.allocate_token_bitmask(1, vocab)
    fills = []
    for t in ids:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(mask, 0)
        fills.append(ms(t0))
        assert m.accept_token(t), "the sample's tokens follow the schema"
    logits = torch.zeros(64, vocab)
    masks = xgr.allocate_token_bitmask(64, vocab)
    t0 = time.perf_counter()
    for _ in range(20):
        xgr.apply_token_bitmask_inplace(logits, masks)
    return setup, c_json, c_regex, fills, ms(t0) / 20


def bench_llguidance(tok, vocab, ids):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp

    t0 = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    setup = ms(t0)
    t0 = time.perf_counter()
    g = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    assert not llguidance.LLMatcher.validate_grammar(g, lt)
    m = llguidance.LLMatcher(lt, g)
    c_json = ms(t0)
    assert not m.is_error(), m.get_error()
    t0 = time.perf_counter()
    llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_regex(REGEX))
    c_regex = ms(t0)
    mask = lnp.allocate_token_bitmask(1, vocab)
    fills = []
    for t in ids:
        t0 = time.perf_counter()
        lnp.fill_next_token_bitmask(m, mask, 0)
        fills.append(ms(t0))
        assert m.consume_token(t), m.get_error()
    return setup, c_json, c_regex, fills, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, nargs="+", default=[1024, 49152, 65536])
    args = ap.parse_args()
    for vocab in args.vocab:
        tok = tokenizer(vocab)
        ids = tok(SAMPLE, add_special_tokens=False).input_ids
        for name, fn in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            setup, cj, cr, fills, apply = fn(tok, vocab, ids)
            line = (
                f"vocab {vocab:6d} {name:10s}: tokenizer setup {setup:8.1f} ms, json schema compile {cj:7.1f} ms, "
                f"regex compile {cr:6.1f} ms, mask fill per token median {statistics.median(fills):.3f} ms "
                f"max {max(fills):.3f} ms over {len(fills)} tokens"
            )
            print(line + (f", apply 64x{vocab} on CPU {apply:.3f} ms" if apply else ""), flush=True)


if __name__ == "__main__":
    main()
