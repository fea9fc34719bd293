"""A chat's messages -> prompt token ids through a chat template: the request's `chat_template`,
else `--chat-template`, else the checkpoint's. Messages are normalized as vLLM hands them to
Hugging Face templates: text content parts joined by newlines, an assistant turn's `content: null`
(beside its `tool_calls`) as "", tool-call arguments parsed from their JSON text, `tool` turns as
they come; the request's `tools` go to the template (whatever its tool_choice: "none" only stops the
parsing). Runs in the pool (rendering and tokenizing a long chat takes a while)."""

import json

from rlt.errors import RequestError
from rlt.serve.errors import short
from rlt.serve.limits import CHARS_PER_POSITION, check_ids, check_text
from rlt.serve.template_sandbox import bounds

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# a message's fields (OpenAI's, and vLLM's reasoning fields of an assistant turn): any other is a
# 400
MESSAGE_FIELDS = {
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "function_call",
    "refusal",
}
MESSAGE_FIELDS |= {"reasoning_content", "reasoning"}
# apply_chat_template's own arguments: not for chat_template_kwargs
_RESERVED = {
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
}
_RESERVED |= {
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
}
_RESERVED |= {"return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}


def _content(i: int, content):
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(
            f"messages[{i}].content must be a string, a list of parts or null, got {short(content)}"
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(
                f"messages[{i}].content[{j}] must be a text part, got {short(part)}: text only"
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_calls(i: int, calls) -> list:
    if not isinstance(calls, list):
        raise RequestError(f"messages[{i}].tool_calls must be a list, got {short(calls)}")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(
                f"messages[{i}].tool_calls entries need a function with a name, got {short(call)}"
            )
        args = fn.get("arguments")
        if isinstance(args, str):  # templates index the arguments (as vLLM gives them)
            try:
                args = json.loads(args)
            except ValueError:
                raise RequestError(
                    f"messages[{i}].tool_calls[{j}].function.arguments must be JSON text, got {short(args)}"
                ) from None
        out.append(call | {"function": fn | {"arguments": args}})
    return out


def messages_of(messages) -> list[dict]:
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise RequestError("messages must be a non-empty list of objects")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {short(role)}"
            )
        if unknown := sorted(set(m) - MESSAGE_FIELDS):
            raise RequestError(f"messages[{i}].{short(unknown[0])} is not a message field")
        m = m | {"content": _content(i, m.get("content"))}
        if m.get("tool_calls") is not None:
            m["tool_calls"] = _tool_calls(i, m["tool_calls"])
        out.append(m)
    return out


def tools_of(tools, max_tools: int | None = None) -> list[dict] | None:
    """The request's tools as templates take them (OpenAI's {"type": "function", "function": {...}}):
    each a function with a non-empty name of its own, at most max_tools of them."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError(f"tools must be a list, got {short(tools)}")
    if max_tools is not None and len(tools) > max_tools:
        raise RequestError(
            f"tools has {len(tools)} entries, more than the limit {max_tools} (--max-tools)"
        )
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(
                f"tools[{i}] must be a function tool with a non-empty name, got {short(t)}"
            )
        if fn["name"] in names:
            raise RequestError(
                f"tools[{i}].function.name {short(fn['name'])} is the name of an earlier tool"
            )
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.add(fn["name"])
    return tools


def render(engine, req, served, add_special_tokens: bool) -> tuple[list[int], str]:
    """(prompt token ids, the rendered text); a template that writes the BOS itself does not get a
    second one from the tokenizer. served: rlt/serve/generate.Served (--chat-template's text, whether
    a request's own template is trusted, the rendering's time limit). Rendering is bounded
    (rlt/serve/template_sandbox.py): its output by what the model could take, its time by the limit."""
    max_positions = engine.model_config.max_positions
    # each renders >= 1 token
    if isinstance(req.messages, list) and len(req.messages) > max_positions:
        raise RequestError(
            f"messages has {len(req.messages)} entries, more than the model's max positions {max_positions}"
        )
    messages = messages_of(req.messages)
    tok = engine.tokenizer
    if req.chat_template is not None and not served.trust_request_chat_template:
        raise RequestError(
            "chat_template: a request's own chat template is refused (the server was not started with "
            "--trust-request-chat-template)"
        )
    template = req.chat_template or served.chat_template or getattr(tok, "chat_template", None)
    if tok is None or not template:
        raise RequestError(
            "this model has no chat template: use /v1/completions or give chat_template"
        )
    kwargs = req.chat_template_kwargs or {}
    if bad := sorted(_RESERVED & set(kwargs)):
        raise RequestError(
            f"chat_template_kwargs cannot set {', '.join(bad)}: they are request fields"
        )
    generation, cont = req.add_generation_prompt, bool(req.continue_final_message)
    generation = not cont if generation is None else generation
    if generation and cont:
        raise RequestError("add_generation_prompt and continue_final_message cannot both be true")
    if cont and messages[-1]["role"] != "assistant":
        raise RequestError("continue_final_message needs the last message to be the assistant's")
    tools = tools_of(getattr(req, "tools", None))
    try:
        with bounds(CHARS_PER_POSITION * max_positions, served.limits.chat_template_timeout):
            text = tok.apply_chat_template(
                messages,
                documents=req.documents,
                tools=tools,
                chat_template=template,
                add_generation_prompt=generation,
                continue_final_message=cont,
                tokenize=False,
                **kwargs,
            )
    except Exception as e:  # noqa: BLE001 - a template error is the request's
        raise RequestError(f"messages cannot be rendered: {type(e).__name__}: {e}") from None
    check_text(text, "messages", max_positions)
    ids = tok(text, add_special_tokens=add_special_tokens).input_ids
    bos = engine.model_config.bos_token_id
    if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    check_ids(ids, "messages", max_positions)
    return ids, text
