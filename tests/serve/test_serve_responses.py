"""OpenAI's Responses API on `rlt serve` (the tiny Ouro, --tool-call-parser hermes, the store on),
checked with real clients: the official `openai` client (responses.create, .stream, .parse with a
pydantic model, .retrieve, .delete), the OpenAI Agents SDK (an agent with a function tool, through
OpenAIResponsesModel and OpenAIChatCompletionsModel) and pydantic-ai (a structured result and a
tool). The random weights write long strings, so the schemas bound theirs (their JSON ends soon)."""

import asyncio
import json
import time
import urllib.request
from typing import Annotated

import openai
import pytest
from pydantic import BaseModel, Field

from tests.serve.helpers import serving

SHORT = Annotated[str, Field(max_length=3)]
SMALL = Annotated[int, Field(ge=0, le=99)]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 3}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class City(BaseModel):
    code: SHORT
    rank: SMALL


@pytest.fixture(scope="module")
def server(checkpoints):
    with serving(
        checkpoints["ouro"], "--tool-call-parser", "hermes", "--responses-store", "4"
    ) as url:
        yield url


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server, api_key="none", max_retries=0)


def test_text_equals_chat_and_its_stream(client):
    """instructions + input run as the chat with a system message; the stream's text and events
    (in OpenAI's order) give the same response; max_output_tokens cuts it: incomplete."""
    kw = dict(model="m", instructions="Be brief.", input="Where does the river run?", temperature=0)
    r = client.responses.create(max_output_tokens=10, **kw)
    chat = client.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where does the river run?"},
        ],
        max_tokens=10,
        temperature=0,
    )
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert r.usage.output_tokens == 10 and r.usage.input_tokens == chat.usage.prompt_tokens
    with client.responses.stream(max_output_tokens=10, **kw) as s:
        events = list(s)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == r.output_text


def test_a_client_that_leaves_a_stream_aborts_its_request(server, client):
    """A stream closed after a few events: its request is aborted at once, not run to its end."""
    body = {"ignore_eos": True}
    with client.responses.stream(
        model="m", input="Go on.", max_output_tokens=3000, extra_body=body
    ) as s:
        for i, _ in enumerate(s):
            if i == 6:
                break
    metrics = server.removesuffix("/v1") + "/metrics"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(metrics, timeout=10) as r:
            running = [
                ln
                for ln in r.read().decode().splitlines()
                if ln.startswith("rlt:num_requests_running{")
            ]
        if running and float(running[0].rsplit(" ", 1)[1]) == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"still running: {running}")


def test_store_continues_a_conversation(client):
    """previous_response_id continues the stored conversation (as a chat with the whole history);
    retrieve gives it back, delete removes it; an unknown id is a 404 naming the field."""
    first = client.responses.create(model="m", input="Hi.", max_output_tokens=6, temperature=0)
    second = client.responses.create(
        model="m",
        input="And then?",
        previous_response_id=first.id,
        max_output_tokens=6,
        temperature=0,
    )
    history = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    chat = client.chat.completions.create(model="m", messages=history, max_tokens=6, temperature=0)
    assert second.output_text == chat.choices[0].message.content
    assert client.responses.retrieve(second.id).output_text == second.output_text
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError, match="no response with id"):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(
            model="m", input="x", previous_response_id="resp_nope", max_output_tokens=2
        )
    assert e.value.body["param"] == "previous_response_id"


def test_function_calls_and_their_outputs(client):
    """tool_choice required: function_call items whose arguments parse, streamed as argument
    deltas; their outputs go back as input items and the model answers."""
    kw = dict(
        model="m", tools=[WEATHER], tool_choice="required", max_output_tokens=200, temperature=1.0
    )
    r = client.responses.create(input="Weather in Oslo?", **kw | {"extra_body": {"seed": 3}})
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed" and all(c.name == "get_weather" for c in calls)
    for c in calls:
        assert set(json.loads(c.arguments)) == {"city"}
    with client.responses.stream(input="Weather in Oslo?", **kw | {"extra_body": {"seed": 3}}) as s:
        events = list(s)
        final = s.get_final_response()
    assert [c.arguments for c in final.output] == [c.arguments for c in calls]
    kinds = {e.type for e in events}
    assert {
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    } <= kinds
    follow = [{"role": "user", "content": "Weather in Oslo?"}]
    follow += [
        {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
        for c in calls
    ]
    follow += [
        {"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls
    ]
    answer = client.responses.create(
        model="m", input=follow, tools=[WEATHER], max_output_tokens=8, temperature=0
    )
    assert answer.output[0].type == "message" and answer.output_text


def test_parse_with_a_pydantic_model(client):
    r = client.responses.parse(
        model="m",
        input="A city.",
        text_format=City,
        max_output_tokens=200,
        temperature=1.0,
        extra_body={"seed": 1},
    )
    assert isinstance(r.output_parsed, City) and r.status == "completed"


def test_fields_it_cannot_honour_are_400s_naming_them(client):
    for kw, param in (
        (dict(max_output_tokens=-1), "max_output_tokens"),
        (dict(text={"format": {"type": "xml"}}), "text"),
        (dict(tools=[{"type": "web_search"}]), "tools"),
        (dict(background=True), "background"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate"),
        (dict(input=[{"type": "image", "url": "x"}]), "input"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="m", **({"input": "x"} | kw))
        assert e.value.body["param"] == param, (kw, e.value.body)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_openai_agents_sdk_runs_an_agent_with_a_tool(server, api):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: SHORT) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=server, api_key="none", max_retries=0)
    model_cls = (
        agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the tool.",
        model=model_cls(model="m", openai_client=client),
        tools=[get_weather],
        # (one call: a random model may go on adding calls to the list until max_tokens)
        model_settings=agents.ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            temperature=1.0,
            extra_body={"seed": 5},
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(agents.Runner.run(agent, "Weather in Oslo?"))
    assert seen and result.final_output == f"sunny in {seen[0]}"


def test_pydantic_ai_gives_a_structured_result_and_calls_a_tool(server):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIResponsesModel("m", provider=OpenAIProvider(base_url=server, api_key="none"))
    # its output is a tool of its own: every turn the grammar makes the model call one of the two
    # (seed 2: the tool twice, then the result)
    settings = {"max_tokens": 200, "temperature": 1.0, "extra_body": {"seed": 2}}
    agent = pydantic_ai.Agent(model, output_type=City, model_settings=settings)
    calls = []

    @agent.tool_plain
    def rank_of(code: SHORT) -> int:
        """A city's rank."""
        calls.append(code)
        return 7

    result = agent.run_sync("A city and its rank.")
    assert isinstance(result.output, City) and calls
    returns = [p for m in result.all_messages() for p in m.parts if p.part_kind == "tool-return"]
    assert [p.content for p in returns if p.tool_name == "rank_of"] == [7] * len(calls)


def test_exit_depths_as_chat_gives_them(client):
    """rlt's return_exit_depths (with Ouro's gate at 0.1): the response's every token's depth, the
    same streamed (the final event's; each text delta carries its own, which the client's stream
    helper does not keep) and as the chat request's."""
    body = {"return_exit_depths": True, "exit_threshold": 0.1}
    kw = dict(model="m", input="Where?", max_output_tokens=12, temperature=0, extra_body=body)
    r = client.responses.create(**kw)
    depths = r.model_extra["exit_depths"]
    assert len(depths) == 12 and len(set(depths)) > 1  # (the gate exits some tokens early)
    with client.responses.stream(**kw) as s:
        events = list(s)
    assert events[-1].response.model_extra["exit_depths"] == depths
    chat = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Where?"}],
        max_tokens=12,
        temperature=0,
        extra_body=body,
    )
    assert chat.choices[0].model_extra["exit_depths"] == depths


def test_reasoning_is_an_output_item(checkpoints):
    """With --reasoning-parser qwen3 and a template that opens <think> (Nanbeige's), the text inside
    the block is a reasoning item's (as chat's reasoning_content), streamed as reasoning_text deltas."""
    with serving(checkpoints["nanbeige"], "--reasoning-parser", "qwen3") as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        kw = dict(model="m", input="Think.", max_output_tokens=10, temperature=0)
        r = client.responses.create(**kw)
        chat = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Think."}],
            max_tokens=10,
            temperature=0,
        )
        with client.responses.stream(**kw) as s:
            events = list(s)
    reasoning = chat.choices[0].message.model_extra["reasoning_content"]
    assert (
        r.output[0].type == "reasoning" and r.output[0].content[0].text == reasoning and reasoning
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == reasoning
