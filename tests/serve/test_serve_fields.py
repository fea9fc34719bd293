"""`rlt serve` honours or refuses every request field (one real server, the official `openai` client
and raw HTTP): unknown and unimplemented fields are 400s naming them, sampling controls reach the
engine (equal to the Python API), stop strings end token ids and usage at the stop, streams send a
chunk per engine output and never a U+FFFD the whole text lacks, chat templates get content parts,
tool calls, per-request templates and kwargs, and /tokenize and /detokenize answer in vLLM's shapes."""

import asyncio

import msgspec
import openai
import pytest

import rlt
from rlt import SamplingParams
from rlt.models.tokenizer import load_tokenizer
from tests.serve.helpers import openai_error, post, serving

replace = msgspec.structs.replace
USER = [{"role": "user", "content": "Where does the river run?"}]
BAD_CALL = {
    "role": "assistant",
    "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}],
}
# a template that renders tool calls and tool results, and thinks when asked (as Qwen's and
# Nanbeige's do)
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}({{ c.function.arguments.city }})"
    "</call>{% endfor %}{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


_TOKENIZER = []  # the checkpoint's (the server's) tokenizer


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    """The tiny Ouro with --chat-template: a file holding TOOL_TEMPLATE."""
    _TOKENIZER[:] = [load_tokenizer(checkpoints["ouro"])]
    template = tmp_path_factory.mktemp("template") / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    with serving(
        checkpoints["ouro"], "--chat-template", str(template), "--trust-request-chat-template"
    ) as url:
        yield url


def test_unknown_and_unimplemented_fields_are_400s_naming_them(server):
    ok, chat = {"prompt": "The river", "max_tokens": 2}, {"messages": USER, "max_tokens": 2}
    refused = [
        ("/v1/completions", ok | {"frobnicate_level": 3}, "frobnicate_level"),
        ("/v1/chat/completions", chat | {"frobnicate_level": 3}, "frobnicate_level"),
        ("/v1/completions", ok | {"tools": []}, "tools"),  # a chat field
        ("/v1/completions", ok | {"suffix": "the end"}, "suffix"),
        ("/v1/completions", ok | {"best_of": 3}, "best_of"),
        ("/v1/completions", ok | {"use_beam_search": True}, "use_beam_search"),
        # no schema
        ("/v1/completions", ok | {"response_format": {"type": "json_schema"}}, "response_format"),
        ("/v1/completions", ok | {"guided_json": {"type": "foo"}}, "guided_json"),
        ("/v1/completions", ok | {"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
        (
            "/v1/chat/completions",
            chat | {"tools": [{"type": "function", "function": {"nom": "f"}}]},
            "tools",
        ),
        ("/v1/chat/completions", chat | {"tool_choice": "required"}, "tool_choice"),
        (
            "/v1/chat/completions",
            chat | {"response_format": {"type": "json_schema"}},
            "response_format",
        ),
        ("/v1/chat/completions", chat | {"modalities": ["audio"]}, "modalities"),
        (
            "/v1/chat/completions",
            chat | {"stream_options": {"include_usage": True}},
            "stream_options",
        ),
        (
            "/v1/completions",
            ok | {"stream": True, "stream_options": {"bogus": 1}},
            "stream_options.bogus",
        ),
        ("/v1/completions", ok | {"logit_bias": {"x": 1}}, "logit_bias"),
        ("/v1/completions", ok | {"logit_bias": {"1": 101}}, "logit_bias"),
        ("/v1/completions", ok | {"repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/completions", ok | {"presence_penalty": 2.5}, "presence_penalty"),
        ("/v1/completions", ok | {"min_p": 1.5}, "min_p"),
        ("/v1/completions", ok | {"min_tokens": 3}, "min_tokens"),  # past max_tokens 2
        (
            "/v1/chat/completions",
            chat | {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            None,
        ),
        (
            "/v1/chat/completions",
            chat | {"add_generation_prompt": True, "continue_final_message": True},
            "add_generation_prompt",
        ),
        (
            "/v1/chat/completions",
            chat | {"chat_template_kwargs": {"tokenize": True}},
            "chat_template_kwargs",
        ),
        ("/v1/chat/completions", chat | {"messages": USER + [BAD_CALL]}, None),
    ]
    for path, body, param in refused:
        status, answer = post(server, path, body)
        assert status == 400, (body, answer)
        e = openai_error(answer, 400, param or "messages")
        assert (param or "messages") in e["message"] or param is None, e
    accepted = [  # never change the output, or ask for nothing
        (
            "/v1/completions",
            ok | {"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"},
        ),
        (
            "/v1/completions",
            ok | {"best_of": 1, "use_beam_search": False, "suffix": "", "echo": False},
        ),
        (
            "/v1/chat/completions",
            chat | {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}},
        ),
        ("/v1/chat/completions", chat | {"parallel_tool_calls": True, "modalities": ["text"]}),
        (
            "/v1/chat/completions",
            chat | {"tools": [{"type": "function", "function": {"name": "f"}}]},
        ),
    ]
    for path, body in accepted:
        status, answer = post(server, path, body)
        assert status == 200 and answer["usage"]["completion_tokens"] == 2, (body, answer)


def test_sampling_controls_equal_the_python_api(checkpoints, server):
    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    controls = {
        "repetition_penalty": 1.3,
        "presence_penalty": 0.7,
        "frequency_penalty": 0.4,
        "min_p": 0.05,
        "logit_bias": {"9": 2.5, "100": -5},
        "min_tokens": 4,
        "seed": 11,
        "top_k": 40,
        "temperature": 0.8,
    }
    client = openai.OpenAI(base_url=server, api_key="none")
    extra = {
        k: v
        for k, v in controls.items()
        if k not in ("presence_penalty", "frequency_penalty", "seed")
    }
    r = client.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=12,
        n=2,
        seed=11,
        presence_penalty=0.7,
        frequency_penalty=0.4,
        extra_body=extra | {"return_token_ids": True},
    )
    sp = SamplingParams(max_tokens=12, **(controls | {"logit_bias": {9: 2.5, 100: -5}}))

    async def choices():
        async with rlt.Engine.launch(checkpoints["ouro"]) as engine:
            return [
                [o async for o in engine.generate(prompt, replace(sp, seed=11 + i))][-1]
                for i in range(2)
            ]

    want = asyncio.run(choices())
    got = sorted(r.choices, key=lambda c: c.index)
    assert [c.model_extra["token_ids"] for c in got] == [w.token_ids for w in want]
    assert all(len(w.token_ids) >= 4 for w in want)
    # a bias of 100 on one token: greedy picks it every time
    r = client.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=6,
        temperature=0,
        logit_bias={"42": 100},
        extra_body={"return_token_ids": True},
    )
    assert r.choices[0].model_extra["token_ids"] == [42] * 6


async def test_stop_strings_end_token_ids_and_usage_at_the_stop(server):
    """30 identical seeded requests: each ends at the token that completed the stop string."""
    client = openai.AsyncOpenAI(base_url=server, api_key="none")
    tok = _TOKENIZER[0]
    kw = dict(
        model="m",
        prompt="The river runs",
        max_tokens=40,
        seed=3,
        extra_body={"return_token_ids": True},
    )
    full = await client.completions.create(
        **kw | {"extra_body": {"return_token_ids": True, "ignore_eos": True}}
    )
    text = full.choices[0].text
    stop = next(text[i : i + 2] for i in range(8, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    start = text.find(stop)
    rs = await asyncio.gather(
        *(
            client.completions.create(
                **kw | {"stop": stop, "extra_body": {"return_token_ids": True, "ignore_eos": True}}
            )
            for _ in range(30)
        )
    )
    for r in rs:
        c = r.choices[0]
        ids = c.model_extra["token_ids"]
        assert (c.text, c.finish_reason, c.model_extra["stop_reason"]) == (
            text[:start],
            "stop",
            stop,
        )
        # the last token completed it
        assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1]), ids
        assert r.usage.completion_tokens == len(ids) < 40
    kept = await client.completions.create(
        **kw
        | {"stop": [stop], "extra_body": {"include_stop_str_in_output": True, "ignore_eos": True}}
    )
    assert kept.choices[0].text == text[: start + len(stop)]
    # streamed: the same text, the same tokens, nothing past the stop
    stream = await client.completions.create(
        **kw
        | {
            "stop": stop,
            "stream": True,
            "extra_body": {"return_token_ids": True, "ignore_eos": True},
        }
    )
    chunks = [c async for chunk in stream for c in chunk.choices]
    assert "".join(c.text for c in chunks) == text[:start]
    assert [i for c in chunks for i in c.model_extra["token_ids"]] == rs[0].choices[0].model_extra[
        "token_ids"
    ]


async def test_streams_send_every_engine_output_and_settled_text(server):
    """The tiny random model writes many partial UTF-8 characters: a token whose text is empty still
    gets its chunk (ids counted), and the streamed text equals the whole one, no U+FFFD it lacks."""
    client = openai.AsyncOpenAI(base_url=server, api_key="none")
    empty_text_chunks = 0
    for seed in range(20):
        kw = dict(
            model="m",
            prompt="Once",
            max_tokens=24,
            seed=seed,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        whole = (await client.completions.create(**kw)).choices[0]
        stream = await client.completions.create(**kw, stream=True)
        chunks = [c async for chunk in stream for c in chunk.choices]
        assert "".join(c.text for c in chunks) == whole.text
        assert [i for c in chunks for i in c.model_extra["token_ids"]] == whole.model_extra[
            "token_ids"
        ]
        assert all(c.model_extra["token_ids"] or c.finish_reason for c in chunks)
        empty_text_chunks += sum(1 for c in chunks if not c.text and c.model_extra["token_ids"])
        # a U+FFFD streamed is one the whole text has at that place
        streamed = ""
        for c in chunks:
            streamed += c.text
            assert whole.text.startswith(streamed)
    assert empty_text_chunks > 0  # (the case this checks happened)


def test_chat_content_parts_tool_calls_templates_and_kwargs(server):
    def rendered(body: dict) -> str:
        status, answer = post(server, "/tokenize", body)
        assert status == 200, answer
        return _TOKENIZER[0].decode(answer["tokens"])

    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Where"}, {"type": "text", "text": "to?"}],
        }
    ]
    assert rendered({"messages": parts}) == rendered(
        {"messages": [{"role": "user", "content": "Where\nto?"}]}
    )
    tools = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    # (the server's --chat-template; a request's own is the same text here)
    body = {"messages": tools}
    assert (
        rendered(body)
        == rendered(body | {"chat_template": TOOL_TEMPLATE})
        == (
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<call>weather(Oslo)</call><|im_end|>\n"
            "<|im_start|>tool\nrain<|im_end|>\n<|im_start|>assistant\n"
        )
    )
    thinking = body | {"chat_template_kwargs": {"enable_thinking": True}}
    assert rendered(thinking).endswith("<|im_start|>assistant\n<think>\n")
    assert rendered(body | {"add_generation_prompt": False}).endswith(
        "<|im_start|>tool\nrain<|im_end|>\n"
    )
    cont = {
        "messages": USER + [{"role": "assistant", "content": "To the"}],
        "continue_final_message": True,
    }
    assert rendered(cont | {"chat_template": TOOL_TEMPLATE}).endswith(
        "<|im_start|>assistant\nTo the"
    )
    # the same through /v1/chat/completions: it generates from that prompt
    client = openai.OpenAI(base_url=server, api_key="none")
    r = client.chat.completions.create(
        model="m",
        messages=tools,
        max_tokens=3,
        temperature=0,
        extra_body={"chat_template": TOOL_TEMPLATE, "return_token_ids": True},
    )
    assert r.model_extra["prompt_token_ids"] == post(server, "/tokenize", body)[1]["tokens"]
    # echo: the final assistant message's text before what it continues with
    r = client.chat.completions.create(
        model="m",
        messages=cont["messages"],
        max_tokens=3,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "echo": True},
    )
    assert r.choices[0].message.content.startswith("To the")


def test_tokenize_and_detokenize_in_vllms_shapes(server):
    tok = _TOKENIZER[0]
    status, answer = post(
        server, "/tokenize", {"prompt": "The river runs", "return_token_strs": True}
    )
    ids = tok("The river runs").input_ids
    assert status == 200 and answer["tokens"] == ids and answer["count"] == len(ids)
    assert answer["token_strs"] == tok.convert_ids_to_tokens(ids) and answer["max_model_len"] > 0
    assert post(server, "/detokenize", {"tokens": ids}) == (200, {"prompt": tok.decode(ids)})
    status, answer = post(server, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and openai_error(answer, 400, "prompt")
    assert post(server, "/detokenize", {"tokens": []}) == (200, {"prompt": ""})
    status, answer = post(
        server, "/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"frob": 1}}
    )
    assert (
        status == 400
        and "stream_options.frob" in openai_error(answer, 400, "stream_options.frob")["message"]
    )
    status, answer = post(server, "/tokenize", {"prompt": "x", "bogus": 1})
    assert status == 400 and openai_error(answer, 400, "bogus")


def test_prompt_and_output_options(server):
    tok = _TOKENIZER[0]
    client = openai.OpenAI(base_url=server, api_key="none")
    prompt = list(range(5, 25))
    extra = {"return_token_ids": True, "truncate_prompt_tokens": 6}
    r = client.completions.create(
        model="m", prompt=prompt, max_tokens=2, temperature=0, extra_body=extra
    )
    assert (
        r.choices[0].model_extra["prompt_token_ids"] == prompt[-6:] and r.usage.prompt_tokens == 6
    )
    eos = tok.eos_token_id
    special = {"logit_bias": {str(eos): 100}, "ignore_eos": True, "skip_special_tokens": False}
    r = client.completions.create(
        model="m", prompt="Hi", max_tokens=2, temperature=0, extra_body=special
    )
    assert r.choices[0].text == tok.decode([eos, eos], skip_special_tokens=False) != ""
    r = client.completions.create(
        model="m",
        prompt="Hi",
        max_tokens=2,
        temperature=0,
        extra_body=special | {"skip_special_tokens": True},
    )
    assert r.choices[0].text == "" and r.usage.completion_tokens == 2
    assert client.completions.create(
        model="m", prompt="Hi", max_tokens=1, extra_body={"priority": -3}
    ).usage
    status, answer = post(server, "/v1/completions", {"prompt": "Hi", "priority": "high"})
    assert status == 400 and openai_error(answer, 400, "priority")
    r = client.completions.create(
        model="m",
        prompt=[5, 6],
        max_tokens=2,
        logprobs=2,
        temperature=0,
        extra_body={"return_tokens_as_token_ids": True},
    )
    assert all(t.startswith("token_id:") for t in r.choices[0].logprobs.tokens)


def test_echo_with_logprobs_gives_every_prompt_token_first_null(server):
    """lm-eval's loglikelihood request: echo, max_tokens 1, logprobs 1 (and max_tokens 0: the prompt alone)."""
    tok = _TOKENIZER[0]
    ids = tok("The river runs").input_ids
    body = {
        "prompt": "The river runs",
        "max_tokens": 1,
        "logprobs": 1,
        "echo": True,
        "temperature": 0,
    }
    status, r = post(server, "/v1/completions", body)
    c = r["choices"][0]
    assert (
        status == 200
        and c["text"].startswith("The river runs")
        and len(c["text"]) > len("The river runs")
    )
    lp = c["logprobs"]
    assert (
        lp["tokens"][: len(ids)] == [tok.decode([i]) for i in ids]
        and len(lp["tokens"]) == len(ids) + 1
    )
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x < 0 for x in lp["token_logprobs"][1:]) and all(
        len(t) == 1 for t in lp["top_logprobs"][1:]
    )
    status, zero = post(server, "/v1/completions", body | {"max_tokens": 0})
    z = zero["choices"][0]
    assert (z["text"], z["logprobs"]["token_logprobs"], zero["usage"]["completion_tokens"]) == (
        "The river runs",
        lp["token_logprobs"][:-1],
        0,
    )
