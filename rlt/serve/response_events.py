"""A streamed Response: the chat route's chunks (rlt/serve/choices.py's events) become OpenAI's
typed server-sent events, in its order: response.created and .in_progress; per output item
(reasoning, the message's text, each function call) .output_item.added, its parts' and deltas'
events and .output_item.done; then response.completed (or .incomplete, cut by max_output_tokens;
or .failed with an error event, when the engine failed mid-way). Items keep their ids from added
to done to the final response, as the official client's stream accumulator checks."""

import copy
import itertools
import json
import time

import msgspec

from rlt.serve import response_objects as rs

_json = msgspec.json.Encoder()


class _Stream:
    def __init__(self, req: object, rid: str, name: str):
        self.req, self.seq = req, itertools.count()
        self.response = rs.envelope(req, rid, name, int(time.time()))
        self.output: list[dict] = []
        self.open: dict | None = None  # the item receiving deltas
        self.call_index: int | None = None  # the chat tool call the open function_call item is
        self.depths: list[int] = []  # return_exit_depths: every output token's, in order

    def event(self, kind: str, **fields) -> bytes:
        """An event of `kind` ("response." and it, but for "error")."""
        kind = kind if kind == "error" else "response." + kind
        data = _json.encode({"type": kind, "sequence_number": next(self.seq), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def lifecycle(self, kind: str) -> bytes:
        return self.event(kind, response=self.response | {"output": copy.deepcopy(self.output)})

    def start(self, item: dict) -> list[bytes]:
        """A new output item (the open one closed first)."""
        out = self.close()
        self.output.append(item)
        self.open, index = item, len(self.output) - 1
        added = copy.deepcopy(item)
        if item["type"] == "message":
            added["content"] = []
        out.append(self.event("output_item.added", output_index=index, item=added))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self.part("content_part.added", part))
        return out

    def at(self, content: bool = False) -> dict:
        """The open item's place in the output (and its content part's, `content`)."""
        at = {"item_id": self.open["id"], "output_index": len(self.output) - 1}
        return at | {"content_index": 0} if content else at

    def part(self, kind: str, part: dict) -> bytes:
        return self.event(kind, **self.at(True), part=part)

    def close(self) -> list[bytes]:
        item, out = self.open, []
        if item is None:
            return out
        index = len(self.output) - 1
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self.event("reasoning_text.done", **self.at(True), text=text))
        elif item["type"] == "message":
            part = item["content"][0]
            lps = part.get("logprobs", [])
            done = self.event("output_text.done", **self.at(True), text=part["text"], logprobs=lps)
            out += [done, self.part("content_part.done", part)]
        else:
            args, name = item["arguments"], item["name"]
            fields = {"arguments": args, "name": name}
            out.append(self.event("function_call_arguments.done", **self.at(), **fields))
        item["status"] = "completed"
        done = copy.deepcopy(item)
        out.append(self.event("output_item.done", output_index=index, item=done))
        self.open = self.call_index = None
        return out

    def reasoning(self, text: str) -> list[bytes]:
        out = []
        if self.open is None or self.open["type"] != "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            item = {
                "id": rs.new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [part],
                "status": "in_progress",
            }
            out += self.start(item)
        self.open["content"][0]["text"] += text
        return out + [self.event("reasoning_text.delta", **self.at(True), delta=text)]

    def text(self, text: str, logprobs: list | None, depths: list | None = None) -> list[bytes]:
        out = []
        if self.open is None or self.open["type"] != "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            if logprobs is not None:
                part["logprobs"] = []
            item = {"id": rs.new_id("msg"), "type": "message", "status": "in_progress"}
            out += self.start(item | {"role": "assistant", "content": [part]})
        part = self.open["content"][0]
        part["text"] += text
        if logprobs is not None:
            part["logprobs"] += logprobs
        # (rlt's exit_depths: the delta's tokens' depths)
        extra = {"logprobs": logprobs or []} | ({} if depths is None else {"exit_depths": depths})
        return out + [self.event("output_text.delta", **self.at(True), delta=text, **extra)]

    def call(self, entry: dict) -> list[bytes]:
        out, fn = [], entry.get("function", {})
        if self.call_index != entry["index"]:
            item = {
                "id": rs.new_id("fc"),
                "type": "function_call",
                "call_id": entry.get("id"),
                "name": fn.get("name"),
                "arguments": "",
                "status": "in_progress",
            }
            out += self.start(item)
            self.call_index = entry["index"]
        if fn.get("arguments"):
            self.open["arguments"] += fn["arguments"]
            delta = fn["arguments"]
            out.append(self.event("function_call_arguments.delta", **self.at(), delta=delta))
        return out


async def events(req: object, chunks, rid: str, name: str, done):
    """chunks: the chat route's server-sent events (bytes); done(response): called with the final
    Response object (the store keeps it)."""
    try:
        async for event in _events(req, chunks, rid, name, done):
            yield event
    finally:  # finished, or the client went away: the chat stream closes (its requests abort)
        await chunks.aclose()


async def _events(req: object, chunks, rid: str, name: str, done):
    s, finish, usage = _Stream(req, rid, name), None, None
    yield s.lifecycle("created")
    yield s.lifecycle("in_progress")
    async for raw in chunks:
        payload = bytes(raw).removeprefix(b"data: ").strip()
        if payload == b"[DONE]":
            break
        d = json.loads(payload)
        # the engine failed mid-way: the response has started, it fails in the stream
        if "error" in d:
            for e in s.close():
                yield e
            err = d["error"]
            message = err.get("message")
            code, param = str(err.get("code")), err.get("param")
            yield s.event("error", code=code, message=message, param=param)
            failed = {"code": "server_error", "message": message}
            s.response |= {"status": "failed", "error": failed}
            yield s.lifecycle("failed")
            return
        usage = d.get("usage") or usage
        for c in d["choices"]:
            delta = c.get("delta") or {}
            lps = (c.get("logprobs") or {}).get("content") if req.top_logprobs else None
            thought = delta.get("reasoning_content")
            for e in s.reasoning(thought) if thought else ():
                yield e
            depths = c.get("exit_depths") if req.return_exit_depths else None
            if depths is not None:
                s.depths += depths
            for e in s.text(delta["content"], lps, depths) if delta.get("content") else ():
                yield e
            for entry in delta.get("tool_calls") or ():
                for e in s.call(entry):
                    yield e
            finish = c.get("finish_reason") or finish
    for e in s.close():
        yield e
    if not s.output:  # (nothing generated: an empty message, as a whole response has)
        for e in s.text("", None) + s.close():
            yield e
    s.response |= {"output": s.output, "usage": rs.usage_of(usage)}
    if req.return_exit_depths:
        s.response["exit_depths"] = s.depths
    rs.finish(s.response, finish)
    done(s.response)
    yield s.lifecycle("completed" if s.response["status"] == "completed" else "incomplete")
