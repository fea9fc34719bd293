"""Structured output and forced tool calls through `rlt serve` (rlt/serve/structured.py,
rlt/frontends/forced.py) on the tiny Ouro, with the official `openai` client: random weights, so
only the grammar makes the output valid. OpenAI's response_format (json_schema, json_object, a
pydantic model through .parse), vLLM's structured_outputs and guided_* (regex, choice), tool_choice
required and named (tool_calls whose arguments validate, streamed deltas that assemble into the same
calls), and bad grammars or two sources as 400s naming the field."""

import json
import re
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from rlt.frontends.forced import Forced
from tests.serve.helpers import CHOICES, PARAMS, REGEX, SCHEMA, TOOLS, USER, post


class Answer(pydantic.BaseModel):
    kind: Literal["a", "b"]
    ok: bool


@pytest.fixture
def client(ouro_server):
    # (conftest.py: one server for the session)
    return openai.OpenAI(base_url=ouro_server, api_key="none")


def test_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    for seed in range(8):
        r = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=48,
            seed=seed,
            n=2,
            temperature=1.0,
            response_format=fmt,
        )
        for c in r.choices:
            assert c.finish_reason == "stop", c.message.content
            jsonschema.validate(json.loads(c.message.content, strict=False), SCHEMA)
    r = client.completions.create(
        model="m",
        prompt="A",
        max_tokens=48,
        seed=1,
        extra_body={"structured_outputs": {"json": SCHEMA}},
    )
    jsonschema.validate(json.loads(r.choices[0].text, strict=False), SCHEMA)
    # any object (greedy, a bias that would close it at once: {})
    close = post(client.base_url.__str__().removesuffix("/"), "/tokenize", {"prompt": "}"})[1][
        "tokens"
    ][-1]
    r = client.chat.completions.create(
        model="m",
        messages=USER,
        max_tokens=16,
        temperature=0,
        logit_bias={str(close): 50},
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(
        model="m", messages=USER, max_tokens=32, seed=3, response_format=Answer
    )
    assert isinstance(r.choices[0].message.parsed, Answer)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=120)


def test_a_newcomers_calls_always_return_objects_and_their_retries_are_accepted(client):
    """Issue 61's newcomer, at temperature 1 on random weights: parse() with a bounded string field
    100 times, and a named tool call 30 times, each sent back with its tool result (accepted)."""
    for seed in range(100):
        r = client.chat.completions.parse(
            model="m",
            messages=USER,
            max_tokens=64,
            seed=seed,
            temperature=1.0,
            response_format=Person,
        )
        assert isinstance(r.choices[0].message.parsed, Person), r.choices[0].message.content
    tools, named = (
        [openai.pydantic_function_tool(Person)],
        {"type": "function", "function": {"name": "Person"}},
    )
    for seed in range(30):
        r = client.chat.completions.create(
            model="m",
            messages=USER,
            tools=tools,
            tool_choice=named,
            seed=seed,
            temperature=1.0,
            max_tokens=64,
        )
        m = r.choices[0].message
        Person.model_validate_json(m.tool_calls[0].function.arguments)
        result = {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "ok"}
        client.chat.completions.create(
            model="m",
            messages=[*USER, m.model_dump(exclude_none=True), result],
            tools=tools,
            max_tokens=2,
        )


def test_regex_and_choice_on_both_endpoints(client):
    for seed in range(3):
        for body in ({"structured_outputs": {"regex": REGEX}}, {"guided_regex": REGEX}):
            r = client.completions.create(
                model="m", prompt="A", max_tokens=16, seed=seed, extra_body=body
            )
            assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
        r = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=16,
            seed=seed,
            extra_body={"structured_outputs": {"regex": REGEX}},
        )
        assert re.fullmatch(REGEX, r.choices[0].message.content)
        for body in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
            r = client.chat.completions.create(
                model="m", messages=USER, max_tokens=8, seed=seed, extra_body=body
            )
            assert r.choices[0].message.content in CHOICES
        r = client.completions.create(
            model="m", prompt="A", max_tokens=8, seed=seed, extra_body=body
        )
        assert r.choices[0].text in CHOICES


def _calls(calls) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in calls]


def test_tool_choice_required_and_named(client):
    named, most = {"type": "function", "function": {"name": "get_weather"}}, 0
    for choice, extra in (
        ("required", {}),
        ("required", {"parallel_tool_calls": False}),
        (named, {}),
    ):
        for seed in range(4):
            kw = dict(
                model="m",
                messages=USER,
                max_tokens=100,
                seed=seed,
                tools=TOOLS,
                tool_choice=choice,
                **extra,
            )
            c = client.chat.completions.create(**kw).choices[0]
            assert c.finish_reason == "tool_calls" and c.message.content is None, c.message
            calls = _calls(c.message.tool_calls)
            assert calls and all(c.id.startswith("chatcmpl-tool-") for c in c.message.tool_calls)
            for name, args in calls:
                jsonschema.validate(json.loads(args), PARAMS[name])
            most = max(most, len(calls))
            if choice is named or extra:
                assert len(calls) == 1 and (choice is not named or calls[0][0] == "get_weather")
            # streamed: a call's first delta names it, the next ones carry its arguments' fragments
            entries, finish = {}, None
            for ch in client.chat.completions.create(**kw, stream=True):
                d = ch.choices[0]
                finish = d.finish_reason or finish
                for e in d.delta.tool_calls or []:
                    got = entries.setdefault(e.index, ["", ""])
                    got[0] += e.function.name or ""
                    got[1] += e.function.arguments or ""
            assert [tuple(entries[i]) for i in sorted(entries)] == calls and finish == "tool_calls"
    assert most > 1  # (required made a list of several calls)


def test_forced_parser_splits_the_same_however_the_text_is_cut():
    text = '[{"name":"get_weather","parameters":{"city":"O\\"s}]","days":[1,{}]}},{"name":"s","parameters":{}}]'
    want = [("get_weather", '{"city":"O\\"s}]","days":[1,{}]}'), ("s", "{}")]
    for k in (len(text), 1, 2, 3, 7):
        f, calls = Forced("required"), []
        pieces = [text[i : i + k] for i in range(0, len(text), k)]
        for i, piece in enumerate(pieces):
            for kind, v in f.feed(piece, i == len(pieces) - 1):
                if kind == "call":
                    calls.append([v[2], ""])
                else:
                    calls[v[0]][1] += v[1]
        assert [tuple(c) for c in calls] == want, k


class Args(pydantic.BaseModel):
    answer: Answer


DEFS_TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": Args.model_json_schema()}}
]


def test_required_lifts_the_tools_defs_to_the_root():
    """A pydantic tool's parameters refer to "#/$defs/...": under `required` they go to the list's root."""
    from rlt.serve.requests import ChatRequest
    from rlt.serve.structured import of

    tools = DEFS_TOOLS
    so, field = of(ChatRequest(messages=USER, tools=tools, tool_choice="required"), True)
    assert field == "tool_choice" and "Answer" in so.json["$defs"]
    assert "$defs" not in so.json["items"]["anyOf"][0]["properties"]["parameters"]
    jsonschema.validate(
        [{"name": "f", "parameters": {"answer": {"kind": "a", "ok": True}}}], so.json
    )


def test_a_tool_with_defs_compiles(client):
    body = {"messages": USER, "max_tokens": 4, "tools": DEFS_TOOLS}
    assert (
        post(
            str(client.base_url).removesuffix("/"),
            "/v1/chat/completions",
            body | {"tool_choice": "required"},
        )[0]
        == 200
    )


def test_bad_grammars_and_two_sources_are_400s_naming_the_field(client):
    url = str(client.base_url).removesuffix("/")
    chat, comp = {"messages": USER, "max_tokens": 4}, {"prompt": "A", "max_tokens": 4}
    cases = [
        (
            chat
            | {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "foo"}},
                }
            },
            "response_format",
        ),
        (chat | {"response_format": {"type": "xml"}}, "response_format"),
        (comp | {"structured_outputs": {"regex": "(ab"}}, "structured_outputs"),
        (comp | {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        (comp | {"structured_outputs": {"structural_tag": "x"}}, "structured_outputs"),
        (comp | {"guided_regex": "(ab"}, "guided_regex"),
        (comp | {"guided_json": "{nope"}, "guided_json"),
        (comp | {"guided_choice": []}, "guided_choice"),
        (comp | {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        (chat | {"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        (chat | {"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
        (chat | {"tool_choice": "required"}, "tool_choice"),
        (
            chat
            | {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            chat
            | {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            comp | {"guided_regex": "a", "guided_whitespace_pattern": " *"},
            "guided_whitespace_pattern",
        ),
        (
            comp | {"guided_regex": "a", "guided_decoding_backend": "outlines"},
            "guided_decoding_backend",
        ),
    ]
    for body, param in cases:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        status, answer = post(url, path, body)
        assert status == 400 and answer["error"]["param"] == param, (body, answer)
    for body in (
        comp | {"response_format": {"type": "text"}},
        comp | {"guided_regex": "a", "guided_decoding_backend": "xgrammar"},
    ):
        assert post(url, "/v1/completions", body)[0] == 200


@pytest.mark.parametrize("family", ["nanbeige", "huginn"])
def test_the_other_families_through_the_client(served, family):
    """The tiny Nanbeige and Huginn too (Ouro: the tests above): seeded json_schema samples validate
    (streamed as whole), a regex matches (Huginn at 2 loops a token: the grammar is the point)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    loops = {"max_loops": 2} if family == "huginn" else {}
    # (conftest.served: the session's)
    client = openai.OpenAI(base_url=served(family), api_key="none")
    for seed in range(2):
        kw = dict(model="m", prompt="A", max_tokens=48, seed=seed, temperature=1.0)
        body = {"structured_outputs": {"json": SCHEMA}} | loops
        r = client.completions.create(**kw, extra_body=body)
        assert r.choices[0].finish_reason == "stop", r.choices[0].text
        jsonschema.validate(json.loads(r.choices[0].text, strict=False), SCHEMA)
        chunks = client.completions.create(**kw, extra_body=body, stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
        r = client.completions.create(**kw, extra_body={"guided_regex": REGEX} | loops)
        assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
    # (Nanbeige's chat opens a reasoning block: tests/workers/test_grammar_after_reasoning.py)
    if family == "huginn":
        r = client.chat.completions.create(
            model="m", messages=USER, max_tokens=48, seed=5, response_format=fmt, extra_body=loops
        )
        jsonschema.validate(json.loads(r.choices[0].message.content, strict=False), SCHEMA)
