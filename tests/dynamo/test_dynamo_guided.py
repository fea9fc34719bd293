"""Guided decoding and tools through Dynamo's frontend to an rlt node (rlt/dynamo/engine.py,
rlt/dynamo/main.py), with the official `openai` client on the tiny Ouro's random weights: only the
grammar can make an output valid. The frontend turns response_format, guided_* and tool_choice
required / named into its request's guided_decoding, which the node gives rlt's engine as a
StructuredOutput; it renders `tools` with the node's chat template and parses tool calls with the
parser the node registers (hermes: Ouro's default). What rlt cannot honour is a 400 naming it."""

import json
import os
import re

import jinja2
import jsonschema
import openai
import pytest

from rlt.models.tokenizer import load_tokenizer
from tests.dynamo.helpers import Stack, _tests
from tests.serve.helpers import CHOICES, PARAMS, REGEX, SCHEMA, TOOLS, USER, WEATHER

pytest.importorskip(
    "dynamo.common.backend", reason="the dynamo extra (README: Dynamo) is not installed"
)

pytestmark = pytest.mark.slow

# the tiny Ouro's ChatML template, with each tool's name written into the prompt
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}{% for t in tools or [] %}<tool>{{ t.function.name }}</tool>{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# fault injection in the nodes' processes (their rlt workers too): this regex passes the
# coordinator's check and fails its compile in the worker
INJECTED = "injected-compile-failure"
SITECUSTOMIZE = f"""
import rlt.workers.grammar_zygote as gc

_compile = gc.compile_spec


def compile_spec(compiler, spec):
    if spec == ("regex", {INJECTED!r}):
        raise gc.GrammarError("structured_output.regex: injected")
    return _compile(compiler, spec)


gc.compile_spec = compile_spec
"""


@pytest.fixture(scope="module")
def nodes(checkpoints, infra, tmp_path_factory):  # noqa: F811
    """Two aggregated nodes, started together: the tiny Ouro with the chat template above (parsers
    auto: hermes), the tiny Nanbeige with its own (auto: deepseek_r1 and hermes; it opens <think>).
    {family: (client, model name)}."""
    tmp = tmp_path_factory.mktemp("dynamo-guided")
    (tmp / "tools.jinja").write_text(TEMPLATE)
    (tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p)
    stacks, procs = {f: Stack(infra, next(_tests)) for f in ("ouro", "nanbeige")}, {}
    try:
        for family, s in stacks.items():
            # (nothing in flight at the end: no 5 s grace period)
            s.env = s.env | {"DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0", "PYTHONPATH": path}
            flags = (
                ["--custom-jinja-template", str(tmp / "tools.jinja")] if family == "ouro" else []
            )
            procs[family] = s.worker(checkpoints[family], "worker", *flags)
        for family, s in stacks.items():
            s.wait_model(procs[family])
        yield {
            f: (openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60), s.model)
            for f, s in stacks.items()
        }
    finally:
        for s in stacks.values():
            s.close()


@pytest.fixture(scope="module")
def node(nodes):
    return nodes["ouro"]


def test_response_format_and_guided_options_constrain_the_output(node):
    client, model = node
    kw = dict(model=model, messages=USER, max_tokens=60, temperature=1.0)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        r = client.chat.completions.create(**kw, seed=seed, response_format=fmt)
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        assert r.choices[0].finish_reason == "stop"
        r = client.chat.completions.create(**kw, seed=seed, extra_body={"guided_regex": REGEX})
        assert re.fullmatch(REGEX, r.choices[0].message.content), r.choices[0].message.content
        r = client.chat.completions.create(**kw, seed=seed, extra_body={"guided_choice": CHOICES})
        assert r.choices[0].message.content in CHOICES
    r = client.chat.completions.create(
        **(kw | {"max_tokens": 8}), response_format={"type": "json_object"}
    )
    # (any object: its keys and strings run long)
    assert r.choices[0].message.content.startswith("{")
    r = client.completions.create(
        model=model,
        prompt=[5, 6, 7],
        max_tokens=9,
        extra_body={"guided_grammar": 'root ::= "x" [0-9]'},
    )
    assert re.fullmatch("x[0-9]", r.choices[0].text)
    refused = [
        ({"guided_regex": "[a-"}, "structured_output.regex"),
        ({"guided_json": SCHEMA, "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        ({"guided_json": SCHEMA, "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        ({"allowed_token_ids": [5, 6]}, "allowed_token_ids"),
        # (its compile failed in the worker)
        ({"guided_regex": INJECTED}, "structured_output.regex: injected"),
    ]
    for extra, name in refused:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kw, extra_body=extra)
        assert name in e.value.message, e.value.message


def test_tools_reach_the_template_and_calls_come_back_as_tool_calls(checkpoints, node):
    """The node's template renders the request's tools (the prompt the node got is exactly it);
    tool_choice required and named are grammars whose calls the frontend returns as tool_calls with
    valid arguments; with tool_choice auto the frontend's hermes parser (the node registered it)
    finds <tool_call> JSON in the text, whole and streamed."""
    client, model = node
    tok = load_tokenizer(checkpoints["ouro"])
    kw = dict(model=model, messages=USER, tools=TOOLS, max_tokens=150, temperature=1.0)
    # (none: the template gets no tools, as vLLM's)
    for choice, tools in (("auto", TOOLS), ("none", None)):
        r = client.chat.completions.create(**(kw | {"max_tokens": 1}), tool_choice=choice)
        prompt = jinja2.Template(TEMPLATE).render(
            messages=USER, tools=tools, add_generation_prompt=True
        )
        assert r.usage.prompt_tokens == len(tok(prompt).input_ids)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        r = client.chat.completions.create(
            **kw, seed=seed, tool_choice="required", parallel_tool_calls=False
        )
        (call,) = _calls(r.choices[0].message)  # (one call at most: maxItems 1)
        jsonschema.validate(call[1], PARAMS[call[0]])
        assert r.choices[0].finish_reason == "tool_calls"
        r = client.chat.completions.create(**kw, seed=seed, tool_choice=named)
        ((name, args),) = _calls(r.choices[0].message)
        assert name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(args, WEATHER)
    # the model's own hermes syntax (here forced by a regex: random weights write no tool call)
    text = 'Sure. <tool_call>{"name": "search", "arguments": {"q": true}}</tool_call>'
    extra = {"guided_regex": re.escape(text)}
    r = client.chat.completions.create(**kw, tool_choice="auto", extra_body=extra)
    m = r.choices[0].message
    assert (m.content, _calls(m), r.choices[0].finish_reason) == (
        "Sure. ",
        [("search", {"q": True})],
        "tool_calls",
    )
    stream = client.chat.completions.create(**kw, tool_choice="auto", extra_body=extra, stream=True)
    content, args, names, ends = "", "", [], []
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                names += [d.function.name] if d.function.name else []
                args += d.function.arguments or ""
            ends += [c.finish_reason] if c.finish_reason else []
    assert (content, names, json.loads(args), ends) == (
        "Sure. ",
        ["search"],
        {"q": True},
        ["tool_calls"],
    )


def test_prompt_logprobs_come_back(node):
    """prompt_logprobs (chat's top-level field): None for the first prompt token, then the prompt
    token's logprob with the top ones, ranked."""
    client, model = node
    r = client.chat.completions.create(
        model=model, messages=USER, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    pls = r.model_extra["prompt_logprobs"]
    assert len(pls) == r.usage.prompt_tokens and pls[0] is None
    for pos in pls[1:]:
        ranked = sorted((e["rank"], e["logprob"]) for e in pos.values() if "rank" in e)
        assert [k for k, _ in ranked] == [1, 2] and ranked[0][1] >= ranked[1][1]
        assert 2 <= len(pos) <= 3 and all(e["logprob"] <= ranked[0][1] for e in pos.values())


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_a_grammar_under_reasoning_starts_where_the_reasoning_ends(nodes, checkpoints):
    """The Nanbeige node registers deepseek_r1 (its template opens <think>): the frontend takes the
    text before </think> as reasoning_content, so the node's grammar waits for </think> (as vLLM's
    with a reasoning parser): the reasoning is the unconstrained request's, token for token, and
    the content after it validates. (</think> is a special token of the tiny Nanbeige: the frontend
    sees it with skip_special_tokens false.)"""
    client, model = nodes["nanbeige"]
    end = load_tokenizer(checkpoints["nanbeige"]).convert_tokens_to_ids("</think>")
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    kw = dict(model=model, messages=USER, temperature=1.0)
    extra = {"skip_special_tokens": False, "nvext": {"extra_fields": ["completion_token_ids"]}}
    ids = lambda r: r.model_extra["nvext"]["completion_token_ids"]  # noqa: E731
    free, closed = [], []  # (the first two of 16 seeds whose reasoning ends early)
    for seed in range(16):
        if len(closed) == 2:
            break
        out = ids(client.chat.completions.create(**kw, seed=seed, max_tokens=24, extra_body=extra))
        free.append((seed, out))
        if end in out:
            closed.append((seed, out[: out.index(end) + 1]))
    assert len(closed) == 2, free
    for seed, reasoning in closed:
        r = client.chat.completions.create(
            **kw, seed=seed, max_tokens=80, response_format=fmt, extra_body=extra
        )
        m = r.choices[0].message
        assert ids(r)[: len(reasoning)] == reasoning and r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(m.content), SCHEMA)
        # (the frontend's split: the text before </think>)
        assert m.model_extra["reasoning_content"]
