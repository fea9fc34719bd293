"""Incremental detokenization: a request's growing output ids -> its text, in O(tokens).

``text`` is, after every push, exactly the full decode of the output so far:
``tokenizer.decode(output_ids, skip_special_tokens=True)`` (the output ids alone; the prompt
never changes how they decode). That includes a pending multi-byte character: while the ids so
far end inside a UTF-8 sequence, ``text`` ends with one U+FFFD, which a later id may turn into
the character (or leave as U+FFFD). Only that last character can change; everything
before it is final, and ``push`` returns what became final (for a caller that streams deltas).

Why not ``tokenizers.decoders.DecodeStream``: it withholds the pending character (so its text is
not the full decode of the prefix), and every step re-decodes all ids since its last emitted
chunk, which is quadratic on a run of skipped special tokens (EOS with ignore_eos) or of bytes
that never make a character (a random-weight model repeating a lone byte token); here each push
costs O(pushed ids) whatever came before.

Algorithm (the window/offset one vLLM uses, made exact for byte-level decoders): keep a window of
the last few ids, decode it, skip the characters already accounted for, and put the rest after
the final text. Exactness for a ``ByteLevel`` decoder, the one all three families' tokenizers
use, whose decode is the lossy UTF-8 decode (one U+FFFD per maximal invalid subpart, one for an
incomplete sequence at the end) of the concatenated bytes of the ids that remain once special
ids (with skip_special_tokens) and ids unknown to the tokenizer are dropped:
- Those ids are dropped here before windowing, as the tokenizer drops them before its decoder, so
  each windowed id carries at least one byte, and a run of them costs nothing.
- If the text does not end in U+FFFD, its last character is complete, the UTF-8 decoder is in its
  initial state, all of it is final and the window restarts empty.
- Otherwise only the last character may be open: an incomplete sequence is at most 3 bytes and
  starts with a lead byte, where every decoder restarts, so the rest of the text is final, and a
  window holding the last CONTEXT >= 3 ids (3+ bytes) decodes that sequence and every later byte
  as the full decode does. The window is cut back to CONTEXT ids whenever it exceeds 2 * CONTEXT,
  so each push decodes O(CONTEXT + pushed ids) ids.

Other tokenizers (``exact`` False: decoder not ``ByteLevel``, e.g. sentencepiece-style
Metaspace + ByteFallback, or ``clean_up_tokenization_spaces`` on) get vLLM's scheme: CONTEXT ids
of left context, and text ending in U+FFFD held open (up to MAX_OPEN ids) until it completes.
Their intermediate texts are usually, not provably, the full decode (ByteFallback decodes a run
of byte tokens all or nothing, so even a complete character can turn back into U+FFFDs), so
``final=True`` re-decodes the whole output once, after which ``text`` is exactly the full decode.

Cost: ``push`` is O(pushed ids). Reading ``text`` builds the cumulative string (one O(length)
join, cached until the next push): unavoidable when every streamed output carries the whole
text, but a memcpy, not a decode.
"""

CONTEXT = 4  # ids of left context the window keeps; >= 3 (the longest incomplete UTF-8 sequence)
MAX_OPEN = 32  # outside exact mode: most ids whose text is held open waiting for a complete char


class IncrementalDetokenizer:
    """One request's output ids -> its text. ``tokenizer``: what
    ``rlt.models.tokenizer.load_tokenizer`` returns (a transformers fast tokenizer).

    ``push(new_ids)`` per batch of new ids, or ``update(cumulative_ids)``; ``text`` is always
    ``tokenizer.decode(all ids pushed, skip_special_tokens=skip_special_tokens)``."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        from tokenizers import decoders

        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # exact: a ByteLevel decoder, with no clean-up added on top by transformers
        self.exact = (
            backend is not None
            and isinstance(backend.decoder, decoders.ByteLevel)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        )
        self._backend = backend
        self._drop = (
            {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
            if self.exact and skip_special_tokens
            else set()
        )
        self._all: list[int] | None = None if self.exact else []  # for the final full decode
        self._window: list[int] = []  # the last ids (dropped ones excluded)
        self._skip = 0  # leading characters of decode(window) already in the final text
        self._final: list[str] = []  # the final text, in pieces
        self._final_len = 0
        self._tail = ""  # text after the final part (exact mode: "" or the open last character)
        self._text: str | None = ""
        self.num_tokens = 0  # ids pushed (dropped ones included)

    @property
    def text(self) -> str:
        if self._text is None:
            final = "".join(self._final)
            self._final = [final]
            self._text = final + self._tail
        return self._text

    @property
    def stable_len(self) -> int:
        """Leading characters of ``text`` that no later id can change (a best effort when
        ``exact`` is False)."""
        return self._final_len

    def update(self, token_ids: list[int], final: bool = False) -> str:
        """Push what is new in the cumulative list ``token_ids`` (e.g. a RequestOutput's; its
        first ``num_tokens`` ids were pushed before); return ``text``."""
        self.push(token_ids[self.num_tokens :], final)
        return self.text

    def push(self, token_ids: list[int], final: bool = False) -> str:
        """Append the output's next ids; return the text that became final with them (all
        returns joined = ``text[:stable_len]``). ``final``: no more ids will come; the open last
        character, if any, becomes final (and outside exact mode ``text`` is re-decoded whole); push
        nothing after it."""
        self.num_tokens += len(token_ids)
        if self.exact:
            backend, drop = self._backend, self._drop
            new = [i for i in token_ids if i not in drop and backend.id_to_token(i) is not None]
        else:
            self._all.extend(token_ids)
            new = list(token_ids)
        delta = ""
        if new:
            win = self._window
            win.extend(new)
            w = self._decode(win)
            if not w.endswith("\ufffd"):  # complete: all of it is final
                delta, self._tail, keep = w[self._skip :], "", 0 if self.exact else CONTEXT
            elif self.exact:  # all but the last character is final
                delta, self._tail, self._skip = w[self._skip : -1], "\ufffd", len(w) - 1
                keep = CONTEXT if len(win) > 2 * CONTEXT else None
            elif len(win) <= MAX_OPEN:  # hold the window's text open (vLLM)
                self._tail, keep = w[self._skip :], None
            else:  # best effort: no longer wait for it to complete
                delta, self._tail, keep = w[self._skip :], "", CONTEXT
            if keep == 0:
                self._window, self._skip = [], 0
            elif keep is not None:  # the window's last ids decode the open tail as all ids do
                self._window = win[-keep:]
                self._skip = max(0, len(self._decode(self._window)) - len(self._tail))
        if final and not self.exact:  # the exact text; the delta assumes it extends what was final
            full = self._tokenizer.decode(self._all, skip_special_tokens=self._skip_special)
            delta = full[self._final_len :]
            self._final, self._final_len, self._tail, self._text = [full], len(full), "", full
            return delta
        if final:
            delta, self._tail = delta + self._tail, ""
        if delta or new or final:
            self._final.append(delta)
            self._final_len += len(delta)
            self._text = None
        return delta

    def _decode(self, ids: list[int]) -> str:
        if self.exact:
            return self._backend.decode(ids, skip_special_tokens=self._skip_special)
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
