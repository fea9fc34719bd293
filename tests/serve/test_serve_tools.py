"""Reasoning and tool-call parsing of chat responses (rlt/frontends/parsers.py): the parsers on
exact texts, whole and cut at every character or at the real tokenizer's tokens (the same split
either way), and through `rlt serve` on the tiny Nanbeige (its defaults: deepseek_r1, hermes) with
the official `openai` client: reasoning_content and content from the real tokens, streamed as deltas
that add up to the whole response, include_reasoning false, tools reaching the template."""

import json

import openai
import pytest

from rlt.control.detokenizer import IncrementalDetokenizer
from rlt.frontends.parsers import Parsing, assemble, default_parsers
from rlt.models.tokenizer import load_tokenizer
from tests.serve.helpers import post

OPEN = "<|im_start|>assistant\n<think>\n"  # a prompt that opens the think block (Nanbeige's)
CALL1 = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Oslo", "days": [1, 2], "x": {"y": "}"}}}\n</tool_call>'
)
CALL2 = '<tool_call>\n{"arguments": {"q": "a\\"b"}, "name": "search"}\n</tool_call>'
TEXT = "Let me see.\n</think>\n\nChecking." + "\n" + CALL1 + "\n" + CALL2 + "\n"
WANT = (
    "Let me see.\n",
    "\n\nChecking.",
    [
        ("get_weather", '{"city": "Oslo", "days": [1, 2], "x": {"y": "}"}}'),
        ("search", '{"q": "a\\"b"}'),
    ],
)


def run(p: Parsing, pieces: list[str]) -> tuple:
    split, reasoning, content, entries = p.new(), "", "", []
    for i, piece in enumerate(pieces):
        out = split.feed(piece, i == len(pieces) - 1)
        reasoning, content, entries = (
            reasoning + out.reasoning,
            content + out.content,
            entries + out.calls,
        )
    calls = assemble(entries)
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in calls)
    return reasoning, content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def cuts(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and in pieces of 2, 3 and 5."""
    return [[text]] + [[text[i : i + k] for i in range(0, len(text), k)] for k in (1, 2, 3, 5)]


def test_parsers_give_the_same_split_however_the_text_is_cut():
    p = Parsing(reasoning=True, prompt_text=OPEN, tools=True)
    for pieces in cuts(TEXT):
        assert run(p, pieces) == WANT, pieces
    # a call's arguments go out as the model writes them; the first entry names the call
    split = p.new()
    entries = [e for ch in TEXT for e in split.feed(ch, False).calls] + split.feed("", True).calls
    first = [e for e in entries if "id" in e]
    assert [e["function"]["name"] for e in first] == ["get_weather", "search"]
    assert sum(1 for e in entries if e["index"] == 0) > 10  # (argument fragments, streamed)
    assert split.any_call


@pytest.mark.parametrize(
    "p, text, want",
    [
        # no block opened by the prompt: one at the output's start, or none
        (Parsing(reasoning=True, prompt_text="x"), "  <think>abc</think>def", ("abc", "def", [])),
        (
            Parsing(reasoning=True, prompt_text="x"),
            "plain <think> text",
            ("", "plain <think> text", []),
        ),
        (Parsing(reasoning=True, prompt_text="x"), "<thin", ("", "<thin", [])),
        (Parsing(reasoning=True, prompt_text=OPEN), "never closed", ("never closed", "", [])),
        (
            Parsing(reasoning=True, prompt_text=OPEN, include_reasoning=False),
            "a</think>b",
            ("", "b", []),
        ),
        # not a call: content as written; an unfinished call whose head is out stands
        (
            Parsing(tools=True),
            "hi <tool_call>{bad}</tool_call> x ",
            ("", "hi <tool_call>{bad}</tool_call> x ", []),
        ),
        (
            Parsing(tools=True),
            'a <tool_call>{"name": "f", "arguments": {"k": 1',
            ("", "a", [("f", '{"k": 1')]),
        ),
        (Parsing(tools=True), "a <tool_call>{", ("", "a <tool_call>{", [])),
        (Parsing(tools=True), "no calls\n", ("", "no calls\n", [])),
        # parallel_tool_calls
        (Parsing(tools=True, one_call=True), CALL1 + CALL2 + " x", ("", "x", WANT[2][:1])),
        # special tokens the engine kept for the markers go; a marker left over too
        (
            Parsing(
                reasoning=True,
                prompt_text=OPEN,
                tools=True,
                strip=("<|im_end|>",),
                drop=("</think>",),
            ),
            'r</think>c</think><tool_call>{"name": "a", "arguments": {}}</tool_call><|im_end|>',
            ("r", "c", [("a", "{}")]),
        ),
    ],
)
def test_parsers_on_exact_texts(p, text, want):
    for pieces in cuts(text):
        assert run(p, pieces) == want, pieces


def test_parsers_on_the_tokenizers_own_pieces(checkpoints):
    """The tiny Nanbeige's tokens (its <think> and </think> are special tokens), detokenized as the
    engine does, token by token: the split equals the whole text's."""
    tok = load_tokenizer(checkpoints["nanbeige"])
    ids = tok(TEXT, add_special_tokens=False).input_ids
    assert tok.convert_tokens_to_ids("</think>") in ids
    detok, pieces = IncrementalDetokenizer(tok, skip_special_tokens=False), []
    for i in ids:
        pieces.append(detok.push([i]))
    assert "".join(pieces) == TEXT
    assert run(Parsing(reasoning=True, prompt_text=OPEN, tools=True), pieces) == WANT


def test_default_parsers_per_family():
    assert default_parsers("nanbeige", None, None) == ("deepseek_r1", "hermes")
    assert default_parsers("ouro", "ChatML", None) == (None, "hermes")
    assert default_parsers("ouro", "... <think> ... </think>", None) == ("deepseek_r1", "hermes")
    assert default_parsers("huginn", "", {}) == (None, None)
    assert default_parsers("huginn", "<tool_call>", {"</think>": 5}) == ("deepseek_r1", "hermes")


@pytest.fixture
def nanbeige(served):
    return served("nanbeige")  # (conftest.served: the session's)


def test_reasoning_content_from_the_real_tokens(checkpoints, nanbeige):
    """The tiny Nanbeige's template opens <think>; a bias on </think> makes it close the block at a
    seeded place: reasoning_content is the text of the tokens before it, content after (special
    tokens dropped as skip_special_tokens drops them); streamed deltas add up to the same."""
    tok = load_tokenizer(checkpoints["nanbeige"])
    end = tok.convert_tokens_to_ids("</think>")
    client = openai.OpenAI(base_url=nanbeige, api_key="none")
    kw = dict(
        model="m", messages=[{"role": "user", "content": "Why?"}], max_tokens=24, temperature=1.0
    )
    closed = 0
    for seed in range(6):
        extra = {"return_token_ids": True, "logit_bias": {str(end): 4.0}, "ignore_eos": True}
        r = client.chat.completions.create(**kw, seed=seed, extra_body=extra)
        c = r.choices[0]
        ids, m = c.model_extra["token_ids"], c.message
        k = ids.index(end) if end in ids else len(ids)
        closed += end in ids
        assert m.model_extra["reasoning_content"] == (
            tok.decode(ids[:k], skip_special_tokens=True) or None
        )
        assert m.content == tok.decode(ids[k + 1 :], skip_special_tokens=True)
        assert m.tool_calls is None and c.finish_reason == "length"
        stream = client.chat.completions.create(**kw, seed=seed, stream=True, extra_body=extra)
        deltas = [ch.choices[0].delta for ch in stream if ch.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == (
            m.model_extra["reasoning_content"] or ""
        )
        assert "".join(d.content or "" for d in deltas) == m.content
        dropped = client.chat.completions.create(
            **kw, seed=seed, extra_body=extra | {"include_reasoning": False}
        )
        assert dropped.choices[0].message.content == m.content
        assert dropped.choices[0].message.model_extra.get("reasoning_content") is None
    assert closed >= 2  # (the case this checks happened)


def test_tools_reach_the_template_and_choices_are_checked(nanbeige):
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    template = "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
    status, answer = post(
        nanbeige, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    assert status == 200
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template": template,
        "max_tokens": 2,
    }
    for choice in ("auto", "none", None):
        status, answer = post(
            nanbeige, "/v1/chat/completions", body | {"tools": tools, "tool_choice": choice}
        )
        assert status == 200, answer
    status, answer = post(
        nanbeige,
        "/tokenize",
        {"messages": body["messages"], "chat_template": template, "tools": tools},
    )
    assert json.dumps(tools) in load_text(nanbeige, answer["tokens"])
    refused = [
        (
            {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ]
    for extra, param in refused:
        status, answer = post(nanbeige, "/v1/chat/completions", body | extra)
        assert status == 400 and answer["error"]["param"] == param, answer
    # a forced call under the template's open <think>: the grammar waits for its end
    # (tests/workers/test_grammar_after_reasoning.py); with a template that opens no block, from the
    # first token
    forced = {
        "messages": body["messages"],
        "max_tokens": 2,
        "tools": tools,
        "tool_choice": "required",
    }
    for b in (forced, body | {"tools": tools, "tool_choice": "required"}):
        status, answer = post(nanbeige, "/v1/chat/completions", b)
        assert status == 200, answer


def load_text(url: str, ids: list[int]) -> str:
    status, answer = post(url, "/detokenize", {"tokens": ids})
    assert status == 200
    return answer["prompt"]


class _Timing:  # (what Choice reports to the metrics: nothing here)
    def output(self, out):
        pass

    def finished(self, reason):
        pass


def test_choice_streams_tool_call_deltas_that_assemble_into_the_whole_message(checkpoints):
    """rlt/serve/choices.py on the engine's delta outputs of the tiny Nanbeige's tokens of TEXT (one
    token each, the text its detokenizer makes final, EOS last): the chunks' deltas add up to the
    whole message, and both finish with tool_calls."""
    from rlt.control.outputs import RequestOutput
    from rlt.serve import openai_api as oa
    from rlt.serve.choices import Choice
    from rlt.serve.requests import Options

    tok = load_tokenizer(checkpoints["nanbeige"])
    ids = tok(TEXT, add_special_tokens=False).input_ids + [tok.eos_token_id]
    strip = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<unk>")
    parsing = Parsing(
        reasoning=True, prompt_text=OPEN, tools=True, strip=strip, drop=("<think>", "</think>")
    )
    opts = Options(
        False,
        False,
        False,
        False,
        False,
        None,
        None,
        False,
        False,
        False,
        0,
        None,
        False,
        None,
        parsing,
    )
    choice = Choice(0, [1, 2], "", opts, _Timing(), oa.token_text(tok, False))
    detok, deltas = IncrementalDetokenizer(tok, skip_special_tokens=False), []
    for k in range(1, len(ids) + 1):
        last = k == len(ids)
        piece = detok.push(ids[k - 1 : k], final=last)
        out = RequestOutput("r", [1, 2], ids[k - 1 : k], [1], piece, last, "stop" if last else None)
        choice.take(out)
        if (d := choice.delta(True)) is not None:
            deltas.append(d)
    whole = choice.final(True)
    m = whole["message"]
    assert (m["reasoning_content"], m["content"]) == WANT[:2] and whole[
        "finish_reason"
    ] == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]] == WANT[2]
    d = [x["delta"] for x in deltas]
    assert "".join(x.get("reasoning_content", "") for x in d) == m["reasoning_content"]
    assert "".join(x.get("content") or "" for x in d) == m["content"]
    streamed = assemble([e for x in d for e in x.get("tool_calls", [])])
    assert [c["function"] for c in streamed] == [c["function"] for c in m["tool_calls"]]
    assert [x["finish_reason"] for x in deltas] == [None] * (len(deltas) - 1) + ["tool_calls"]
    assert len([x for x in d if "tool_calls" in x]) > 5  # (arguments streamed in fragments)
