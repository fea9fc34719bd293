"""Tool calls the grammar forced (tool_choice required or named, rlt/serve/structured.py): the
output is plain JSON, not the model's tool syntax, parsed incrementally into the same events as
rlt/frontends/parsers.py's Hermes: ("call", (index, id, name)) once a call's name is known, then
("args", (index, text)) as its arguments are written (so a stream's fragments join into the whole
response's). Named: the whole output is the arguments. Required: `[{"name": ..., "parameters":
{...}}, ...]`, each call's parameters text its arguments (as vLLM). Scanned a character at a time,
so the events never depend on how the text was cut."""

import json
import re
import uuid

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"parameters"\s*:\s*(?=\S)')


def _id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class Forced:
    def __init__(self, forced: str):
        self.name = None if forced == "required" else forced  # None: a list of calls
        self.buf, self.state, self.calls = "", "list" if self.name is None else "named", 0
        # in the current arguments
        self.depth, self.in_str, self.esc, self.begun = 0, False, False, False

    def feed(self, text: str, final: bool) -> list[tuple]:
        out = []
        if self.name is not None:  # named: every character is the arguments
            if self.calls == 0 and (text or final):
                out.append(("call", (0, _id(), self.name)))
                self.calls = 1
            if text:
                out.append(("args", (0, text)))
            return out
        self.buf += text
        while self.buf:
            if self.state == "list":  # before a call: "[" or "," (or the list's "]")
                s = self.buf.lstrip()
                if not s:
                    self.buf = ""
                    break
                self.buf, self.state = s[1:], "head" if s[0] in "[," else "list"
            elif self.state == "head":
                m = _HEAD.match(self.buf)
                if m is None:
                    break  # (its name is still being written)
                out.append(("call", (self.calls, _id(), json.loads(m.group(1)))))
                self.calls += 1
                self.buf, self.state = self.buf[m.end() :], "args"
                self.depth, self.in_str, self.esc, self.begun = 0, False, False, False
            elif self.state == "args":
                n = self._scan()
                if n:
                    out.append(("args", (self.calls - 1, self.buf[:n])))
                    self.buf = self.buf[n:]
                if self.state == "args":
                    break
            else:  # "close": the call object's "}"
                s = self.buf.lstrip()
                if not s:
                    self.buf = ""
                    break
                self.buf, self.state = s[1:], "list"
        if final:
            self.buf = ""
        return out

    def _scan(self) -> int:
        """How many characters of buf belong to the arguments value (state "close" once it ends)."""
        for i, ch in enumerate(self.buf):
            begun, self.begun = self.begun, True
            if self.in_str:
                self.esc, self.in_str = (False, True) if self.esc else (ch == "\\", ch != '"')
                continue
            if self.depth == 0 and ch in ",}" and begun:  # (a scalar value's end)
                self.state = "close"
                return i
            if ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.state = "close"
                    return i + 1
        return len(self.buf)
