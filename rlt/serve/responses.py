"""OpenAI's Responses API (`POST /v1/responses`, and `GET` / `DELETE /v1/responses/{id}` with the
store on) as a second shape of the chat pipeline: a request becomes a chat request (its
`instructions` a system message, its input items messages, assistant tool calls and tool results;
its function tools, `tool_choice`, `text.format` and `max_output_tokens` chat's fields), runs
through rlt/serve/generate.py's chat route, and the chat response or chunks become a Response
object or its typed server-sent events (rlt/serve/response_events.py) in OpenAI's order. A chat
error names the chat field; here it names the Responses field it came from. The store (off unless
`--responses-store N`) keeps the last N responses with their conversations, for GET, DELETE and
`previous_response_id`.
"""

import time
import uuid
from collections import OrderedDict
from typing import Any

import msgspec

from rlt.serve import requests as rq
from rlt.serve.errors import HTTPError, short

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
    text: dict[str, Any] | None = (
        None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    )
    reasoning: dict[str, Any] | None = (
        None  # {"effort", "summary"}: a reasoning parser's output is an item
    )
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    background: bool | None = None
    max_tool_calls: Int | None = None
    # ---- accepted: they never change the output ----
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # ---- vLLM's and rlt's own (chat's fields of the same name) ----
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
        raise HTTPError(
            400, f"input must be a text or a list of items, got {short(items)}", param="input"
        )
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
            raise HTTPError(
                400, f"input[{i}]: items of type {short(kind)} are not supported", param="input"
            )
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
        raise HTTPError(
            400, f"tools[{i}].type {short(kind)}: only function tools are supported", param="tools"
        )
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


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def envelope(req: ResponsesRequest, rid: str, name: str, created: int) -> dict:
    """The Response object around its output (status, output and usage set by the caller)."""
    fmt = (req.text or {}).get("format") or {"type": "text"}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": name,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": bool(req.store is not False),
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def output_items(message: dict, logprobs: list | None, status: str = "completed") -> list[dict]:
    """A chat message -> Responses output items: reasoning, the message's text, each tool call."""
    items = []
    if message.get("reasoning_content"):
        part = {"type": "reasoning_text", "text": message["reasoning_content"]}
        items.append(
            {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [part],
                "status": status,
            }
        )
    if message.get("content") or not message.get("tool_calls"):
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        msg = {
            "id": new_id("msg"),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [part],
        }
        items.append(msg)
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        items.append(
            {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
                "status": status,
            }
        )
    return items


def usage_of(chat_usage: dict | None) -> dict | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached or 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def finish(response: dict, finish_reason: str | None) -> dict:
    """Its status by the chat choice's finish reason: cut by max_output_tokens is incomplete."""
    if finish_reason == "length":
        response["status"], response["incomplete_details"] = (
            "incomplete",
            {"reason": "max_output_tokens"},
        )
    else:
        response["status"] = "completed"
    return response


def from_chat(req: ResponsesRequest, chat: dict, rid: str, name: str) -> dict:
    """A whole chat response -> the Response object."""
    response = envelope(req, rid, name, int(time.time()))
    choice = chat["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("content") if req.top_logprobs else None
    response["output"] = output_items(choice["message"], logprobs)
    response["usage"] = usage_of(chat.get("usage"))
    if req.return_exit_depths:
        response["exit_depths"] = choice["exit_depths"]
    return finish(response, choice.get("finish_reason"))


def conversation(body: dict, response: dict) -> list[dict]:
    """The chat messages a later response continues from: this one's, and its output as the
    assistant's message (without the instructions: each request gives its own, as OpenAI's)."""
    messages = [
        m for m in body["messages"] if not (m["role"] == "system" and m is body["messages"][0])
    ]
    text = "".join(
        p["text"]
        for item in response["output"]
        if item["type"] == "message"
        for p in item["content"]
    )
    calls = [
        {
            "id": i["call_id"],
            "type": "function",
            "function": {"name": i["name"], "arguments": i["arguments"]},
        }
        for i in response["output"]
        if i["type"] == "function_call"
    ]
    reply = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return messages + [reply]


class Store:
    """The last `size` responses (least recently stored out), each with its conversation."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, messages: list[dict]) -> None:
        if self.size:
            self._items[response["id"]] = (response, messages)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str, field: str | None = None) -> tuple[dict, list[dict]]:
        if not self.size:
            raise HTTPError(
                400,
                f"{field or 'id'}: the response store is off "
                "(start the server with --responses-store N)",
                param=field,
            )
        if rid not in self._items:
            raise HTTPError(
                404,
                f"no response with id {short(rid)} (stored are the last {self.size})",
                param=field,
            )
        return self._items[rid]

    def delete(self, rid: str) -> dict:
        self.get(rid)
        del self._items[rid]
        return {"id": rid, "object": "response", "deleted": True}
