"""A chat choice's generated text -> reasoning_content, content and tool_calls, as vLLM's
`--reasoning-parser` and `--tool-call-parser` split it. The parsers are incremental (a stream feeds
each new piece; `final` flushes what was held back) and the split never depends on how the text was
cut: the whole text fed at once gives what the stream's pieces add up to.

Reasoning (`deepseek_r1`, `qwen3`: `<think>…</think>`): the block is open from the first token when
the prompt ends inside it (Nanbeige's template writes `<think>\\n`), else only when the output begins
with `<think>`; an output that never closes it is all reasoning. Tool calls (`hermes`, Nanbeige's
format): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number; the text outside
them is content (whitespace next to a call dropped). A call's name goes out once its arguments
begin, then the arguments text as the model writes it (so the streamed fragments join into the
whole response's string); a call whose head is not `{"name": "...", "arguments":` is taken whole at
its end (then its arguments re-encoded), and one that is not JSON stays content.
"""

import functools
import json
import re
import uuid
from dataclasses import dataclass, field

from rlt.frontends.forced import Forced

REASONING_PARSERS = ("deepseek_r1", "qwen3")
TOOL_PARSERS = ("hermes",)
THINK, END_THINK = "<think>", "</think>"
CALL, END_CALL = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


@functools.lru_cache(maxsize=64)
def _prefixes(words: tuple[str, ...]) -> tuple[frozenset, int]:
    """The words' proper prefixes, and the longest word's length (a per-token check is a few lookups)."""
    return frozenset(w[:k] for w in words for k in range(1, len(w))), max(
        map(len, words), default=1
    )


def _held(text: str, words: tuple[str, ...], prefixes: tuple | None = None) -> int:
    """How many last characters of text may still begin one of words (held back until they settle)."""
    starts, longest = prefixes or _prefixes(words)
    for k in range(min(len(text), longest - 1), 0, -1):
        if text[-k:] in starts:
            return k
    return 0


def default_parsers(
    family: str, template: str | None, vocab: dict | None
) -> tuple[str | None, str | None]:
    """(reasoning parser, tool-call parser) for a checkpoint: Nanbeige4.2 thinks in <think> and calls
    tools in Hermes's <tool_call> JSON (its template and special tokens); Ouro's templates are ChatML
    with no tool syntax of their own (Hermes is ChatML's convention) and its Thinking variants think in
    <think>; Huginn's has neither. A template or vocabulary that has the markers turns them on."""
    has = lambda w: w in (template or "") or w in (vocab or {})  # noqa: E731
    reasoning = "deepseek_r1" if family == "nanbeige" or has(END_THINK) else None
    tools = "hermes" if family in ("nanbeige", "ouro") or has(CALL) else None
    return reasoning, tools


class Think:
    """<think>…</think>: (kind, text) pieces, kind "reasoning" or "content"."""

    def __init__(self, prompt_text: str):
        self.state = "reasoning" if prompt_text.rstrip().endswith(THINK) else "start"
        self.buf = ""

    def feed(self, text: str, final: bool) -> list[tuple[str, str]]:
        self.buf += text
        out = []
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(THINK):
                    self.buf, self.state = s[len(THINK) :], "reasoning"
                    continue
                if not final and THINK.startswith(s):  # (nothing yet, or a <think> forming)
                    return out
                self.state = "content"
            elif self.state == "reasoning":
                i = self.buf.find(END_THINK)
                if i >= 0:
                    out.append(("reasoning", self.buf[:i]))
                    self.buf, self.state = self.buf[i + len(END_THINK) :], "content"
                    continue
                keep = 0 if final else _held(self.buf, (END_THINK,))
                out.append(("reasoning", self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                return [p for p in out if p[1]]
            else:
                out.append(("content", self.buf))
                self.buf = ""
                return [p for p in out if p[1]]


@dataclass
class _Call:
    index: int
    head: int | None = None  # where the arguments begin in the call's text (None: not yet seen)
    sent: int = 0  # arguments characters sent
    space: str = ""  # the content's whitespace before it


class Hermes:
    """<tool_call> JSON </tool_call>: pieces ("content", text), ("call", (index, id, name)),
    ("args", (index, text))."""

    def __init__(self):
        self.buf, self.call, self.calls = "", None, 0
        # content's trailing whitespace, held; just after a call
        self.space, self.after_call = "", False

    def _content(self, text: str, out: list) -> None:
        if self.after_call:
            text = text.lstrip()
            self.after_call = not text
        if not text:
            return
        body = text.rstrip()
        if body:
            out.append(("content", self.space + body))
            self.space = ""
        self.space += text[len(body) :]

    def feed(self, text: str, final: bool) -> list[tuple]:
        self.buf += text
        out = []
        while True:
            if self.call is None:
                i = self.buf.find(CALL)
                if i < 0:
                    keep = 0 if final else _held(self.buf, (CALL,))
                    self._content(self.buf[: len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep :]
                    if final and self.space and not self.calls:
                        out.append(("content", self.space))
                    return out
                self._content(self.buf[:i], out)
                # (the space goes if this is a call)
                self.call = _Call(self.calls, space=self.space)
                self.space, self.buf = "", self.buf[i + len(CALL) :]
                continue
            j = self.buf.find(END_CALL)
            body = self.buf if j < 0 else self.buf[:j]
            c = self.call
            if c.head is None and (m := _HEAD.match(body)):
                c.head = m.end()
                out.append(
                    ("call", (c.index, f"chatcmpl-tool-{uuid.uuid4().hex}", json.loads(m.group(1))))
                )
                self.calls += 1
            closed = j >= 0 or final
            if c.head is not None:
                region = body[c.head :]
                if not closed:
                    region = region[: len(region) - _held(region, (END_CALL,))]
                args = region.rstrip()
                # (the call object's own brace)
                args = args[:-1].rstrip() if args.endswith("}") else args
                if len(args) > c.sent:
                    out.append(("args", (c.index, args[c.sent :])))
                    c.sent = len(args)
            elif closed:
                self._whole(body, out, closing=j >= 0, space=c.space)
            if not closed:
                return out
            self.buf = self.buf[j + len(END_CALL) :] if j >= 0 else ""
            self.call, self.after_call = None, self.calls > 0
            if j < 0:
                return out

    def _whole(self, body: str, out: list, closing: bool, space: str) -> None:
        """A call whose head did not match: taken as a whole if it is the JSON of a call, else content."""
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", obj.get("parameters", {}))
            assert isinstance(name, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            self.space = space + self.space
            self._content(CALL + body + (END_CALL if closing else ""), out)
            return
        index = self.calls
        self.calls += 1
        out.append(("call", (index, f"chatcmpl-tool-{uuid.uuid4().hex}", name)))
        out.append(("args", (index, json.dumps(args, ensure_ascii=False))))


@dataclass(frozen=True)
class Parsing:
    """What a chat request's choices parse: the reasoning block (open when the prompt opened it), tool
    calls, and the special tokens the engine kept for the markers that the text must lose."""

    reasoning: bool = False
    prompt_text: str = ""
    tools: bool = False
    include_reasoning: bool = True
    strip: tuple[str, ...] = ()
    one_call: bool = False  # parallel_tool_calls false: the first call only (as vLLM)
    # special markers left over in the text once parsed (skip_special_tokens drops them)
    drop: tuple[str, ...] = ()
    # tool_choice "required" or the named function: plain JSON (rlt/frontends/forced.py)
    forced: str | None = None

    def new(self) -> "Split":
        return Split(self)


@dataclass
class Pieces:
    reasoning: str = ""
    content: str = ""
    calls: list = field(default_factory=list)  # OpenAI's tool_calls delta entries, in order


class _Strip:
    """Removes these words from a text fed in pieces (a suffix that may begin one is held back)."""

    def __init__(self, words: tuple[str, ...]):
        self.words, self.held, self.prefixes = words, "", _prefixes(words)
        self.re = re.compile("|".join(map(re.escape, sorted(words, key=len, reverse=True))))

    def feed(self, text: str, final: bool) -> str:
        if not self.words:
            return text
        text = self.held + text
        keep = 0 if final else _held(text, self.words, self.prefixes)
        self.held = text[len(text) - keep :]
        return self.re.sub("", text[: len(text) - keep])


class Split:
    """One choice's text through the parsers: feed the text's new part, get its Pieces."""

    def __init__(self, p: Parsing):
        self.p = p
        self.think = Think(p.prompt_text) if p.reasoning else None
        self.hermes = Forced(p.forced) if p.forced else Hermes() if p.tools else None
        self.strip = _Strip(p.strip)  # special tokens the engine kept (for the markers' sake)
        self.drop = (_Strip(p.drop), _Strip(p.drop))  # markers left in the reasoning, the content
        self.any_call = False

    def feed(self, text: str, final: bool) -> Pieces:
        text = self.strip.feed(text, final)
        kinds = self.think.feed(text, final) if self.think else [("content", text)]
        out = Pieces()
        for kind, piece in kinds:
            if kind == "reasoning":
                out.reasoning += piece if self.p.include_reasoning else ""
            elif self.hermes is None:
                out.content += piece
            else:
                self._calls(self.hermes.feed(piece, False), out)
        if final and self.hermes is not None:
            self._calls(self.hermes.feed("", True), out)
        out.reasoning, out.content = (
            self.drop[0].feed(out.reasoning, final),
            self.drop[1].feed(out.content, final),
        )
        return out

    def _calls(self, events: list, out: Pieces) -> None:
        for kind, v in events:
            if kind != "content" and self.p.one_call and v[0] > 0:
                continue
            if kind == "content":
                out.content += v
            elif kind == "call":
                self.any_call = True
                index, id_, name = v
                out.calls.append(
                    {
                        "index": index,
                        "id": id_,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                )
            else:
                index, text = v
                last = out.calls[-1] if out.calls else None
                if last is not None and last["index"] == index:
                    last["function"]["arguments"] += text
                else:
                    out.calls.append({"index": index, "function": {"arguments": text}})


def assemble(entries: list[dict]) -> list[dict]:
    """tool_calls delta entries -> the whole calls (as a client assembles a stream's)."""
    calls: dict[int, dict] = {}
    for e in entries:
        c = calls.setdefault(
            e["index"],
            {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
        )
        c["id"] = e.get("id", c["id"])
        fn = e["function"]
        if "name" in fn:
            c["function"]["name"] = fn["name"]
        c["function"]["arguments"] += fn.get("arguments", "")
    return [calls[i] for i in sorted(calls)]
