"""A request's grammar: OpenAI's `response_format`, vLLM's `structured_outputs` and older
`guided_*`, and `tool_choice` required or named -> rlt.StructuredOutput (at most one source per
request), and the request field that the engine's errors about it are renamed to.

Forced tool calls follow vLLM: a named function's output is its `parameters` JSON (the arguments),
`required`'s a JSON list of one or more `{"name": ..., "parameters": {...}}` (one of the tools each;
one at most with parallel_tool_calls false); rlt/frontends/forced.py turns the text into tool_calls.
"""

import json

from rlt.contract.sampling_params import StructuredOutput
from rlt.errors import RequestError
from rlt.frontends.parsers import CALL, END_CALL
from rlt.serve.errors import HTTPError, short

BACKEND = "xgrammar"  # the engine's grammar library (rlt/contract/grammar.py)
_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's structured_outputs keys that change nothing here: rlt's JSON is always compact (no free
# whitespace), which every whitespace setting allows
_NO_EFFECT = ("disable_any_whitespace", "disable_fallback", "disable_additional_properties")


def _bad(field: str, why: str):
    return HTTPError(400, f"{field}: {why}", "invalid_request_error", field.split(".")[0])


def _response_format(v) -> StructuredOutput | None:
    kind = v.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise _bad(
            "response_format", f"type must be text, json_object or json_schema, got {short(kind)}"
        )
    js = v.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise _bad("response_format", "json_schema needs a schema object (json_schema.schema)")
    return StructuredOutput(json=js["schema"])  # (strict or not, the schema is enforced)


def _structured_outputs(v: dict) -> StructuredOutput:
    for k in v:
        if k not in _KINDS and k not in _NO_EFFECT:
            raise _bad(
                f"structured_outputs.{k}",
                "not supported (json, regex, choice, grammar or json_object)",
            )
    given = {k: v[k] for k in _KINDS if v.get(k) not in (None, False)}
    if len(given) != 1:
        raise _bad(
            "structured_outputs",
            f"set exactly one of {', '.join(_KINDS)}, got {sorted(given) or 'none'}",
        )
    return StructuredOutput(**given)


def _tool_choice(req, tools: list) -> StructuredOutput | None:
    """tool_choice required or named -> the schema of the JSON the model writes (vLLM's)."""
    choice = req.tool_choice
    if choice in (None, "none", "auto"):
        return None
    fns = {}
    for t in tools or []:  # (rlt/serve/chat.py refuses malformed tools)
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            fns[fn["name"]] = fn
    if choice == "required":
        if not fns:
            raise _bad("tool_choice", "required needs tools")
        items, defs = [], {}
        # ("#/$defs/..." refs resolve at the root: the tools' $defs go there, as vLLM)
        for n, f in fns.items():
            params = dict(_params(f))
            defs |= params.pop("$defs", {})
            items.append(
                {
                    "properties": {"name": {"type": "string", "enum": [n]}, "parameters": params},
                    "required": ["name", "parameters"],
                }
            )
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
        if defs:
            schema["$defs"] = defs
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return StructuredOutput(json=schema)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise _bad(
            "tool_choice", f"must be none, auto, required or a named function, got {short(choice)}"
        )
    if name not in fns:
        raise _bad("tool_choice", f"names {short(name)}, which is not one of the tools")
    return StructuredOutput(json=_params(fns[name]))


def tool_call_tag(tools: list, one: bool) -> StructuredOutput:
    """tool_choice auto under the hermes parser: free text, and each `<tool_call>` the model begins is
    one of the tools with arguments its `parameters` admit (`one`: at most one call)."""
    tags = [
        {
            "type": "tag",
            "begin": f'{CALL}\n{{"name": {json.dumps(t["function"]["name"])}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": _params(t["function"])},
            "end": f"}}\n{END_CALL}",
        }
        for t in tools
    ]
    fmt = {"type": "triggered_tags", "triggers": [CALL], "tags": tags, "stop_after_first": one}
    return StructuredOutput(structural_tag={"type": "structural_tag", "format": fmt})


def _params(fn: dict) -> dict:
    p = fn.get("parameters")
    return p if isinstance(p, dict) else {"type": "object", "properties": {}}


def forced(req) -> str | None:
    """The call the grammar forces: "required", the named function, or None (the model's own syntax)."""
    c = getattr(req, "tool_choice", None)
    if c == "required":
        return c
    return c.get("function", {}).get("name") if isinstance(c, dict) else None


def of(req, chat: bool) -> tuple[StructuredOutput | None, str | None]:
    """The request's StructuredOutput and the field it came from (None, None: unconstrained); a
    second source is a 400 naming it."""
    found = []
    if (v := req.response_format) is not None:
        if not isinstance(v, dict):
            raise _bad("response_format", f"must be an object, got {short(v)}")
        found.append(("response_format", _response_format(v)))
    if (v := req.structured_outputs) is not None:
        found.append(("structured_outputs", _structured_outputs(v)))
    for kind in ("json", "regex", "choice", "grammar"):
        if (v := getattr(req, f"guided_{kind}")) is not None:
            found.append((f"guided_{kind}", StructuredOutput(**{kind: v})))
    if chat and (so := _tool_choice(req, req.tools)) is not None:
        found.append(("tool_choice", so))
    found = [(f, so) for f, so in found if so is not None]
    if len(found) > 1:
        raise _bad(found[1][0], f"a request gives one grammar; it has {found[0][0]} already")
    if req.guided_decoding_backend not in (None, BACKEND, "auto"):
        raise _bad(
            "guided_decoding_backend",
            f"{short(req.guided_decoding_backend)}: the engine's is {BACKEND}",
        )
    if req.guided_whitespace_pattern is not None:
        raise _bad(
            "guided_whitespace_pattern",
            "not supported: the engine's JSON is always compact (no whitespace)",
        )
    return (found[0][1], found[0][0]) if found else (None, None)


def rename(e: RequestError, source: str | None) -> HTTPError | None:
    """The engine's error about the grammar ("structured_output.json: ...") as a 400 naming the
    request field it came from (tool_choice's schema is the tools')."""
    msg = str(e)
    if source is None or not msg.startswith("structured_output"):
        return None
    field = "tools" if source == "tool_choice" else source
    rest = msg.split(":", 1)[1].strip() if ":" in msg else msg
    return HTTPError(400, f"{field}: {rest}", "invalid_request_error", field)
