"""OpenAI's Responses API (`POST /v1/responses`, and `GET` / `DELETE /v1/responses/{id}` with the
store on) as a second shape of the chat pipeline: a request becomes a chat request (its
`instructions` a system message, its input items messages, assistant tool calls and tool results;
its function tools, `tool_choice`, `text.format` and `max_output_tokens` chat's fields), runs
through rlt/serve/generate.py's chat route, and the chat response or chunks become a Response
object (rlt/serve/response_objects.py) or its typed server-sent events
(rlt/serve/response_events.py) in OpenAI's order. A chat error names the chat field; here it names
the Responses field it came from. The store (off unless `--responses-store N`) keeps the last N
responses with their conversations, for GET, DELETE and `previous_response_id`.
"""

from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from rlt.serve import generate, response_events
from rlt.serve import requests as rq
from rlt.serve import response_objects as ro
from rlt.serve.errors import HTTPError, short

_json = msgspec.json.Encoder()

Int = rq.Int


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    input: Any = None  # a text, or a list of items (messages, function calls and their outputs)
    instructions: str | None = None
    max_output_tokens: Int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: Int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    text: dict[str, Any] | None = None
    # {"effort", "summary"}: a reasoning parser's output is an item
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    background: bool | None = None
    max_tool_calls: Int | None = None
    # ---- accepted: they never change the output --------------------------------------------------
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # ---- vLLM's and rlt's own (chat's fields of the same name) -----------------------------------
    top_k: Int | None = None
    min_p: float | None = None
    seed: Int | None = None
    stop: str | list[str] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool | None = None
    priority: Int | None = None
    request_id: str | None = None
    min_loops: Int | None = None
    max_loops: Int | None = None
    exit_threshold: float | None = None
    exit_criterion: str | None = None
    speculative_loops: Int | None = None
    speculative_tokens: Int | None = None
    return_exit_depths: bool | None = None  # every output token's loop depth, as chat's


# fields passed to chat as they are
_SAME = (
    *(
        "temperature",
        "top_p",
        "tool_choice",
        "parallel_tool_calls",
        "top_k",
        "min_p",
        "seed",
        "stop",
    ),
    *(
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "priority",
        "request_id",
    ),
    *(
        "min_loops",
        "max_loops",
        "exit_threshold",
        "exit_criterion",
        "speculative_loops",
        "speculative_tokens",
    ),
    *(
        "user",
        "metadata",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "return_exit_depths",
    ),
)
# a chat field an error names -> the Responses field it came from
RENAMED = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "logprobs": "top_logprobs",
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def parse(body: dict) -> ResponsesRequest:
    req = rq.parse(body, ResponsesRequest)
    for name, asks_nothing, why in (
        ("background", lambda v: not v, "background responses are not supported"),
        (
            "truncation",
            lambda v: v == "disabled",
            "only truncation 'disabled' is supported (a long input is a 400)",
        ),
        ("include", lambda v: not v, "include: no extra output data is supported"),
        (
            "max_tool_calls",
            lambda v: False,
            "max_tool_calls is not supported: use parallel_tool_calls false",
        ),
        (
            "stream_options",
            lambda v: set(v) <= {"include_obfuscation"},
            "only include_obfuscation is supported",
        ),
    ):
        v = getattr(req, name)
        if v is not None and not asks_nothing(v):
            raise HTTPError(400, f"{name} {short(v)}: {why}", param=name)
    if req.reasoning and req.reasoning.get("effort") not in (None,):
        raise HTTPError(
            400,
            f"reasoning.effort {short(req.reasoning['effort'])} is not supported",
            param="reasoning",
        )
    if req.input is None:
        raise HTTPError(400, "input: a text or a list of items is required", param="input")
    return req


def chat_body(req: ResponsesRequest, history: list[dict]) -> dict:
    """The chat request this one runs as; history: the stored conversation it continues."""
    body = {k: v for k in _SAME if (v := getattr(req, k)) is not None}
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body["messages"] = messages + history + messages_of(req.input)
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools is not None:
        body["tools"] = [_tool(i, t) for i, t in enumerate(req.tools)]
    if isinstance(req.tool_choice, dict) and req.tool_choice.get("type") == "function":
        body["tool_choice"] = {
            "type": "function",
            "function": {"name": req.tool_choice.get("name")},
        }
    if req.top_logprobs:
        body |= {"logprobs": True, "top_logprobs": req.top_logprobs}
    fmt = (req.text or {}).get("format")
    if fmt is not None:
        body["response_format"] = _format(fmt)
    if req.stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def messages_of(items) -> list[dict]:
    """Responses input -> chat messages: a text is the user's; message items keep their role
    (developer as system), function calls join into an assistant message, their outputs are tool
    messages; reasoning items are the model's own (dropped, as chat templates drop them)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        why = f"input must be a text or a list of items, got {short(items)}"
        raise HTTPError(400, why, param="input")
    out = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and ROLES.get(item.get("role")):
            out.append({"role": ROLES[item["role"]], "content": _text(i, item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments", "")}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            output = output if isinstance(output, str) else _text(i, output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind != "reasoning":
            why = f"input[{i}]: items of type {short(kind)} are not supported"
            raise HTTPError(400, why, param="input")
    return out


def _text(i: int, content) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise HTTPError(400, f"input[{i}].content must be a text or a list of parts", param="input")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in (
            "input_text",
            "output_text",
            "text",
        ):
            kind = part.get("type") if isinstance(part, dict) else part
            raise HTTPError(
                400,
                f"input[{i}].content: parts of type {short(kind)} are not supported",
                param="input",
            )
        texts.append(part.get("text", ""))
    return "".join(texts)


def _tool(i: int, t) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function":
        kind = t.get("type") if isinstance(t, dict) else t
        why = f"tools[{i}].type {short(kind)}: only function tools are supported"
        raise HTTPError(400, why, param="tools")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def _format(fmt) -> dict:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise HTTPError(
            400,
            f"text.format must be text, json_object or json_schema, got {short(fmt)}",
            param="text",
        )
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    js = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": js}


def renamed(e: HTTPError) -> HTTPError:
    """A chat error as this endpoint's: the field it names is the Responses field it came from."""
    if e.param in RENAMED:
        e.message = e.message.replace(e.param, RENAMED[e.param], 1)
        e.param = RENAMED[e.param]
    return e


async def respond(request: Request, body: dict, served: generate.Served, name: str):
    """/v1/responses: the request runs as a chat request, its response or stream in the Responses
    shape; kept in the store unless it says store: false."""
    req = parse(body)
    history = []
    if req.previous_response_id:
        history = served.responses.get(req.previous_response_id, "previous_response_id")[1]
    chat = chat_body(req, history)
    try:
        res = await generate.chat(request, chat, served, name)
    except HTTPError as e:
        raise renamed(e) from None
    rid = ro.new_id("resp")

    def done(response: dict) -> None:
        if req.store is not False:
            served.responses.put(response, ro.conversation(chat, response))

    if isinstance(res, StreamingResponse):
        events = response_events.events(req, res.body_iterator, rid, name, done)
        return StreamingResponse(events, media_type="text/event-stream")
    if res.status_code != 200:  # (499: the client went away)
        return res
    response = ro.from_chat(req, msgspec.json.decode(res.body), rid, name)
    done(response)
    return Response(_json.encode(response), media_type="application/json")
