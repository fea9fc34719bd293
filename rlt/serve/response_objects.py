"""The Response objects of /v1/responses (rlt/serve/responses.py): the envelope a Response carries,
a chat message's output items (reasoning, the message's text, each function call), usage, status,
the conversation a later response continues, and the bounded store (`--responses-store N`)."""

import time
import uuid
from collections import OrderedDict

from rlt.serve.errors import HTTPError, short


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def envelope(req, rid: str, name: str, created: int) -> dict:
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


def from_chat(req, chat: dict, rid: str, name: str) -> dict:
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
    first = body["messages"][0]
    messages = [m for m in body["messages"] if not (m["role"] == "system" and m is first)]
    texts = (p["text"] for i in response["output"] if i["type"] == "message" for p in i["content"])
    text = "".join(texts)
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
            off = "the response store is off (start the server with --responses-store N)"
            raise HTTPError(400, f"{field or 'id'}: {off}", param=field)
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
