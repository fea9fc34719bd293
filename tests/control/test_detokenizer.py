"""IncrementalDetokenizer: after every push its text is exactly tokenizer.decode(all output ids,
skip_special_tokens=True), for the three families' tokenizers as the checkpoint maker ships them,
and a 32K-id stream costs time linear in its length."""

import random
import time

import pytest
from tokenizers import decoders

from rlt.control.detokenizer import CONTEXT, IncrementalDetokenizer
from rlt.models.tokenizer import CORPUS, load_tokenizer

FAMILIES = ("ouro", "nanbeige", "huginn")
TEXTS = (
    "Ça va? Crème brûlée, naïve café, Ångström, Øresund, ß, ŀ, Ω≈ç√∫",
    "日本語のテキスト、中文字符和한국어 텍스트。",
    "emoji: 😀🎉👍🏽 👩‍👩‍👧‍👦 🇯🇵 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝄞",
    "combining: e\u0301 a\u0308 n\u0303; zero width\u200bspace; tab\tnew\nline  two  spaces",
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable char map, which the ByteLevel pre-tokenizer uses."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@pytest.fixture(scope="module")
def toks(checkpoints):
    return {f: load_tokenizer(checkpoints[f]) for f in FAMILIES}


def _byte_ids(tok) -> list[int]:
    """Token id of each single byte 0..255 (the trainer's initial alphabet holds all of them)."""
    ids = tok.convert_tokens_to_ids([c for _, c in sorted(_bytes_to_unicode().items())])
    assert len(set(ids)) == 256 and all(i is not None for i in ids)
    return ids


def _specials(tok) -> list[int]:
    return sorted(
        i for i, t in tok.backend_tokenizer.get_added_tokens_decoder().items() if t.special
    )


def _check(tok, chunks, skip_special_tokens=True):
    """Push the chunks one by one; after each, the text is the full decode of the ids so far and
    the returned final parts add up to text[:stable_len]. Returns the final text."""
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    assert d.exact
    ids, deltas = [], []
    for chunk in chunks:
        ids += chunk
        deltas.append(d.push(chunk))
        full = tok.decode(ids, skip_special_tokens=skip_special_tokens)
        assert d.text == full, (ids, d.text, full)
        assert d.num_tokens == len(ids)
        assert "".join(deltas) == full[: d.stable_len]
        assert d.stable_len >= len(full) - 1  # at most the last character is open
        assert d.stable_len == len(full) or full.endswith("\ufffd")
    deltas.append(d.push([], final=True))
    assert d.text == full and d.stable_len == len(full) and "".join(deltas) == full
    return d.text


def _chunked(ids, rng, max_chunk):
    out, i = [], 0
    while i < len(ids):
        k = rng.randint(1, max_chunk)
        out.append(ids[i : i + k])
        i += k
    return out


def test_exact_mode_for_the_three_families(toks):
    for tok in toks.values():
        assert isinstance(tok.backend_tokenizer.decoder, decoders.ByteLevel)
        assert IncrementalDetokenizer(tok).exact


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("max_chunk", (1, 3, 8))
def test_random_ids(toks, family, max_chunk):
    """Random ids, weighted to the hard cases: lone bytes (>= 0x80 split characters or never make
    one), multi-byte tokens, specials (EOS, BOS, ... skipped) and ids the tokenizer lacks."""
    tok = toks[family]
    vocab, byte_ids, specials = len(tok), _byte_ids(tok), _specials(tok)
    high = [byte_ids[b] for b in range(0x80, 0x100)]
    for seed in range(60):
        rng = random.Random(seed * 10 + max_chunk)
        ids = []
        for _ in range(rng.randint(1, 80)):
            r = rng.random()
            ids.append(
                rng.choice(high)
                if r < 0.4
                else rng.choice(specials)
                if r < 0.5
                else vocab + rng.randrange(8)
                if r < 0.53
                else rng.randrange(vocab)
            )
        _check(tok, _chunked(ids, rng, max_chunk))


@pytest.mark.parametrize("family", FAMILIES)
def test_random_bytes(toks, family):
    """Streams of single-byte tokens: every UTF-8 case (valid 2/3/4-byte characters, truncated
    ones, overlong, surrogates, lone continuation bytes), one byte at a time or several."""
    tok = toks[family]
    byte_ids = _byte_ids(tok)
    for seed in range(150):
        rng = random.Random(seed)
        data = bytearray()
        while len(data) < 40:
            r = rng.random()
            if r < 0.5:  # a valid character, maybe truncated
                c = chr(
                    rng.choice(
                        (
                            rng.randrange(0x80, 0x800),
                            rng.randrange(0x800, 0xD800),
                            rng.randrange(0xE000, 0x10000),
                            rng.randrange(0x10000, 0x110000),
                        )
                    )
                )
                enc = c.encode()
                data += enc[: rng.randint(1, len(enc))] if rng.random() < 0.3 else enc
            else:
                data.append(rng.choice((rng.randrange(0x80, 0x100), rng.randrange(0x100))))
        ids = [byte_ids[b] for b in data]
        assert _check(tok, _chunked(ids, rng, 1 + seed % 4)) == data.decode("utf-8", "replace")


@pytest.mark.parametrize("family", FAMILIES)
def test_multibyte_text(toks, family):
    tok = toks[family]
    eos = tok.eos_token_id
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        for k in (1, 2, 3, 5, 7):
            assert _check(tok, [ids[i : i + k] for i in range(0, len(ids), k)]) == text
        # a special token between every two ids, inside multi-byte characters too: skipped
        with_eos = [x for i in ids for x in (i, eos)]
        assert _check(tok, [[i] for i in with_eos]) == text
        assert _check(tok, [with_eos[i : i + 3] for i in range(0, len(with_eos), 3)]) == text
    assert _check(
        tok, [[i] for i in tok.encode("".join(TEXTS), add_special_tokens=False)]
    ) == "".join(TEXTS)


@pytest.mark.parametrize("family", FAMILIES)
def test_hand_made_cases(toks, family):
    tok = toks[family]
    b = _byte_ids(tok)
    eos, A = tok.eos_token_id, tok.convert_tokens_to_ids("A")
    cases = {
        # 丠 = E4 B8 A0 split by 20 skipped EOS
        "丠": [[b[0xE4]]] + [[eos]] * 20 + [[b[0xB8]], [b[0xA0]]],
        "😀A": [[b[0xF0]], [b[0x9F]], [b[0x98]], [b[0x80]], [A]],
        "\ufffdA": [[b[0xE4]], [b[0xB8]], [A]],  # truncated 3-byte char: one U+FFFD
        "\ufffd丠": [[b[0xF0]], [b[0x9F]], [b[0xE4]], [b[0xB8]], [b[0xA0]]],
        "\ufffd" * 50: [[b[0xC3]]] * 50,  # a lone lead byte repeated: always open
        "\ufffd" * 51: [[b[0x80]]] * 50 + [[b[0xF0]]],  # lone continuation bytes, then a lead
        # the output's first ids continue a character the prompt began: decoded as the output
        # alone (the prompt does not take part)
        "\ufffd\ufffdA": [[b[0xB8]], [b[0xA0]], [A]],
        "": [[eos]] * 10,
    }
    for want, chunks in cases.items():
        assert _check(tok, chunks) == want
    # the pending character shows as U+FFFD until it completes
    d = IncrementalDetokenizer(tok)
    assert d.push([A, b[0xE4], b[0xB8]]) == "A" and d.text == "A\ufffd" and d.stable_len == 1
    assert d.push([eos]) == "" and d.text == "A\ufffd"
    assert d.push([b[0xA0]]) == "丠" and d.text == "A丠" and d.stable_len == 2
    # a final push closes an open character as U+FFFD
    assert d.push([b[0xF0]]) == "" and d.text == "A丠\ufffd"
    assert d.push([], final=True) == "\ufffd" and d.text == "A丠\ufffd" and d.stable_len == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_special_tokens_kept(toks, family):
    tok = toks[family]
    b, specials = _byte_ids(tok), _specials(tok)
    ids = tok.encode(TEXTS[2], add_special_tokens=False)
    mixed = [[x] for i in ids for x in (i, specials[i % len(specials)])] + [
        [b[0xE4]],
        [specials[0]],
        [b[0xB8]],
    ]
    text = _check(tok, mixed, skip_special_tokens=False)
    assert text == tok.decode([x for c in mixed for x in c]) and text.endswith("\ufffd")
    assert tok.decode([specials[0]]) in text


@pytest.mark.parametrize("family", FAMILIES)
def test_update_takes_the_cumulative_list(toks, family):
    tok = toks[family]
    ids = tok.encode(TEXTS[1] + TEXTS[2], add_special_tokens=False) + [tok.eos_token_id]
    d = IncrementalDetokenizer(tok)
    rng = random.Random(0)
    n = 0
    while n < len(ids):
        n = min(len(ids), n + rng.randint(0, 4))
        assert d.update(ids[:n], final=n == len(ids)) == tok.decode(
            ids[:n], skip_special_tokens=True
        )
    assert d.text == TEXTS[1] + TEXTS[2] and d.num_tokens == len(ids)


class _CountingBackend:
    """The tokenizers backend, counting the ids the detokenizer decodes."""

    def __init__(self, backend):
        self.backend, self.decoded = backend, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.backend.decode(ids, **kw)

    def id_to_token(self, i):
        return self.backend.id_to_token(i)


def _streams(tok):
    """32,768-id output streams: real text, random ids (weighted to lone bytes and specials), a
    lone lead byte repeated (its text always ends open) and EOS repeated (all skipped)."""
    n = 1 << 15
    text = tok.encode(CORPUS.read_text(), add_special_tokens=False)
    text = (text * (n // len(text) + 1))[:n]
    rng = random.Random(0)
    b, specials, vocab = _byte_ids(tok), _specials(tok), len(tok)
    mixed = [
        rng.choice((b[rng.randrange(0x80, 0x100)], rng.choice(specials), rng.randrange(vocab)))
        for _ in range(n)
    ]
    return {
        "text": text,
        "random": mixed,
        "lead byte": [b[0xC3]] * n,
        "eos": [tok.eos_token_id] * n,
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_linear_cost_32k(toks, family):
    """Pushing 32,768 ids one at a time: O(1) decoded ids per push (counted), well under a second
    of CPU, and the second 16K take no longer than the first (a quadratic cost would take ~3x:
    the old full re-decode per token, ~24 s for 8K ids). Timed in this thread's CPU time: other
    processes on the machine do not stretch it."""
    tok = toks[family]
    for name, ids in _streams(tok).items():
        half = len(ids) // 2
        times = []
        for rep in range(3):
            d = IncrementalDetokenizer(tok)
            counter = d._backend = _CountingBackend(d._backend)
            t0 = time.thread_time()
            for i in ids[:half]:
                d.push([i])
            t1 = time.thread_time()
            for i in ids[half:]:
                d.push([i])
            t2 = time.thread_time()
            times.append((t1 - t0, t2 - t1))
            assert d.text == tok.decode(ids, skip_special_tokens=True), name
            assert counter.decoded <= (3 * CONTEXT + 1) * len(ids), (name, counter.decoded)
        first, second = min(t[0] for t in times), min(t[1] for t in times)
        print(
            f"{family} {name}: first 16K {first * 1e3:.0f} ms, second 16K {second * 1e3:.0f} ms, "
            f"{counter.decoded / len(ids):.2f} decoded ids/id"
        )
        assert first + second < 3.0, (name, first, second)
        assert second < 1.5 * first + 0.01, (name, first, second)


def test_stream_with_text_every_push(toks):
    """What the stream does: the cumulative ids in, the whole text out, every token. Reading the
    text joins it (O(length) memcpy per read), still far from the old re-decode. (This thread's CPU
    time: other processes on the machine do not stretch it.)"""
    tok = toks["nanbeige"]
    ids = _streams(tok)["text"]
    d, cumulative = IncrementalDetokenizer(tok), []
    t0 = time.thread_time()
    for i in ids:
        cumulative.append(i)  # as RequestOutput.token_ids grows
        text = d.update(cumulative)
    elapsed = time.thread_time() - t0
    print(f"update + text per id, 32K ids: {elapsed * 1e3:.0f} ms")
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert elapsed < 5.0


def _sentencepiece_style():
    """A Llama-style tokenizer (Metaspace-like normalizer, BPE with byte fallback, Replace +
    ByteFallback + Fuse + Strip decoders): not byte-level, so not exact mode."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in sorted(set(CORPUS.read_text().replace(" ", "▁")) - {"\n"} | {"▁"}):
        vocab.setdefault(c, len(vocab))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"), ("▁", "a")]
    for a, c in merges:
        vocab.setdefault(a + c, len(vocab))
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    t.add_special_tokens(["<s>", "</s>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=t,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def test_other_tokenizers_exact_when_final(checkpoints):
    """Outside exact mode (another decoder, or clean-up on top): the final text is exactly the
    full decode; intermediate texts are exact on text without byte-fallback characters."""
    sp = _sentencepiece_style()
    cleanup = load_tokenizer(checkpoints["ouro"])
    cleanup.clean_up_tokenization_spaces = True
    for tok in (sp, cleanup):
        d = IncrementalDetokenizer(tok)
        assert not d.exact
        plain = "the quick brown fox, then the end. In a tin hat!"
        ids = tok.encode(plain, add_special_tokens=False)
        for n in range(1, len(ids) + 1):
            d.push(ids[n - 1 : n], final=n == len(ids))
            assert d.text == tok.decode(ids[:n], skip_special_tokens=True)
        assert d.text == tok.decode(ids, skip_special_tokens=True)
        vocab = len(tok)
        for seed in range(100):
            rng = random.Random(seed)
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 120))]
            ids += tok.encode(TEXTS[seed % len(TEXTS)], add_special_tokens=False)
            d = IncrementalDetokenizer(tok)
            chunks = _chunked(ids, rng, 4)
            for i, c in enumerate(chunks):
                d.push(c, final=i == len(chunks) - 1)
            assert d.text == tok.decode(ids, skip_special_tokens=True)
            assert d.stable_len == len(d.text)
