"""The generating routes: /v1/completions and /v1/chat/completions (a typed body -> SamplingParams
-> one engine call per prompt, its n choices together), and vLLM's /tokenize and /detokenize.
A client that goes away aborts its requests (a stream's response is cancelled by Starlette; a whole
one watches for the disconnect while it waits)."""

import asyncio
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from rlt.errors import EngineDeadError, EngineOverloadedError, RequestError
from rlt.frontends.parsers import CALL, END_CALL, END_THINK, THINK, Parsing, Think
from rlt.serve import chat as chat_template
from rlt.serve import openai_api as oa
from rlt.serve import requests as rq
from rlt.serve import structured
from rlt.serve.choices import Choice, events, run, usage
from rlt.serve.errors import HTTPError, short
from rlt.serve.flags import Limits
from rlt.serve.limits import Pool, check_prompts, token_ids
from rlt.serve.response_objects import Store

_json = msgspec.json.Encoder()


@dataclass
class Served:
    """What the routes share: the request bounds, the tokenizing pool, --chat-template's text."""

    limits: Limits
    pool: Pool
    chat_template: str | None = None
    reasoning_parser: str | None = None  # --reasoning-parser (rlt/frontends/parsers.py)
    tool_parser: str | None = None  # --tool-call-parser
    # --trust-request-chat-template: a request may give its own
    trust_request_chat_template: bool = False
    responses: Store = field(default_factory=lambda: Store(0))  # --responses-store


@contextmanager
def bad_request():
    """A RequestError (it names the field first) as a 400 naming it."""
    try:
        yield
    except RequestError as e:
        raise HTTPError(400, str(e), "invalid_request_error", rq.field_named(str(e))) from None


def _truncate(ids: list[int], k: int | None) -> list[int]:
    return ids if k is None else ids[-k:]


async def completion(request: Request, body: dict, served: Served, name: str):
    state = request.app.state
    engine = state.engine
    with bad_request():
        req = rq.parse(body, rq.CompletionRequest)
        params, opts = rq.to_sampling_params(req, False, state.defaults)
        prompts = check_prompts(
            req.prompt, params.n, engine.model_config.max_positions, served.limits
        )

        def tokenize():
            ids = [
                _truncate(
                    token_ids(engine, p, opts.add_special_tokens), opts.truncate_prompt_tokens
                )
                for p in prompts
            ]
            if not opts.echo:  # (a token-id prompt is decoded only to be echoed)
                return ids, [""] * len(ids)
            echo = [
                p
                if isinstance(p, str) and opts.truncate_prompt_tokens is None
                else _decode(engine, i)
                for p, i in zip(prompts, ids)
            ]
            return ids, echo

        ids, echoes = await served.pool.run(tokenize)
    await check_grammar(served, engine, params, opts)
    return await _respond(request, params, opts, ids, echoes, False, name)


async def chat(request: Request, body: dict, served: Served, name: str):
    state = request.app.state
    with bad_request():
        req = rq.parse(body, rq.ChatRequest)
        # (before a forced call's schema is built)
        chat_template.tools_of(req.tools, served.limits.max_tools)
        params, opts = rq.to_sampling_params(req, True, state.defaults)
        ids, text = await served.pool.run(
            chat_template.render, state.engine, req, served, opts.add_special_tokens
        )
        ids = _truncate(ids, opts.truncate_prompt_tokens)
        opts.parsing, params = parsing(req, text, served, state.engine.tokenizer, params)
        # (the tools' call tag)
        if opts.grammar_field is None and params.structured_output is not None:
            opts.grammar_field = "tools"
        last = req.messages[-1] if isinstance(req.messages, list) else {}
        echo = (
            chat_template.messages_of([last])[0]["content"]
            if opts.echo and last.get("role") == "assistant"
            else ""
        )
    await check_grammar(served, state.engine, params, opts)
    return await _respond(request, params, opts, [ids], [echo], True, name)


def parsing(req, prompt_text: str, served: Served, tok, params):
    """The request's reasoning and tool-call parsing (None: none) and its params: a grammar under a
    prompt that opens a reasoning block starts where the block ends (as vLLM), markers that are
    special tokens stay in the engine's text (skip_special_tokens false, as vLLM's tool parsers ask)
    and the server drops the other special tokens itself."""
    forced = structured.forced(req)  # (the grammar makes the calls: no tool parser needed)
    tools = bool(req.tools) and req.tool_choice != "none" and forced is None
    if tools and served.tool_parser is None:
        raise RequestError(
            "tools: this server parses no tool calls (start it with --tool-call-parser hermes)"
        )
    reasoning = served.reasoning_parser is not None
    # (a call, once begun, is constrained: its arguments parse)
    if tools and params.structured_output is None:
        tag = structured.tool_call_tag(req.tools, one=req.parallel_tool_calls is False)
        params = msgspec.structs.replace(params, structured_output=tag)
    so = params.structured_output
    if reasoning and so is not None and Think(prompt_text).state == "reasoning":
        # the engine starts the grammar after </think>'s ids in the output: the content is the
        # grammar's
        after = tok(END_THINK, add_special_tokens=False).input_ids
        params = msgspec.structs.replace(
            params, structured_output=msgspec.structs.replace(so, after=after)
        )
    if not (tools or reasoning or forced):
        return None, params
    markers = {THINK, END_THINK} if reasoning else set()
    markers |= {CALL, END_CALL} if tools else set()
    specials = {
        t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special
    }
    strip = drop = ()
    if params.skip_special_tokens and markers & specials:
        params = msgspec.structs.replace(params, skip_special_tokens=False)
        strip, drop = tuple(sorted(specials - markers)), tuple(sorted(markers & specials))
    return Parsing(
        reasoning=reasoning,
        prompt_text=prompt_text,
        tools=tools,
        include_reasoning=req.include_reasoning is not False,
        strip=strip,
        one_call=req.parallel_tool_calls is False,
        drop=drop,
        forced=forced,
    ), params


async def check_grammar(served: Served, engine, params, opts: rq.Options) -> None:
    """The request's grammar checked in the pool (a large schema's structure takes a while; the
    engine's own check at the call then finds it cached): a 400 naming the field it came from."""
    from rlt.contract import grammar

    if params.structured_output is not None:
        try:
            spec = grammar.spec_of(params.structured_output)
            await served.pool.check(grammar.check, spec, engine.engine_config)
        except RequestError as e:
            raise structured.rename(e, opts.grammar_field) or HTTPError(400, str(e)) from None


def _decode(engine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids) if engine.tokenizer is not None else ""


async def _respond(
    request: Request, params, opts: rq.Options, prompts: list, echoes: list, chat: bool, name: str
):
    """prompts: token ids, checked (tokenized in the pool); one engine call per prompt (its n choices)."""
    state, record = request.app.state, request.state.rlt
    engine, n, streams = state.engine, params.n, []
    # the body's request_id (vLLM's), else X-Request-Id's (rlt/serve/middleware.py: the client's or
    # a fresh one)
    base = opts.id or request.state.request_id
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{base}"
    try:
        for i, ids in enumerate(prompts):
            p = params
            if p.max_tokens is None:  # chat: up to the context; completions: 16, as OpenAI
                p = msgspec.structs.replace(
                    p, max_tokens=max(1, engine.model_config.max_positions - len(ids))
                )
            # (the engine's id names the HTTP request in worker logs; a client may reuse its ids)
            streams.append(
                engine.generate(ids, p, f"{rid}-{i}-{uuid.uuid4().hex[:8]}", opts.priority, "delta")
            )
    except (RequestError, EngineDeadError, EngineOverloadedError) as e:
        for s in streams:  # those already admitted go
            await s.aclose()
        # (a call's prompts and choices are admitted whole or not at all)
        if isinstance(e, EngineOverloadedError):
            raise HTTPError(503, str(e), public=True) from None
        if isinstance(e, EngineDeadError):
            raise HTTPError(503, str(e), "service_unavailable") from None
        raise structured.rename(e, opts.grammar_field) or HTTPError(
            400, str(e), "invalid_request_error", rq.field_named(str(e))
        ) from None
    record.prompt_tokens = sum(map(len, prompts))
    kind = "chat.completion" if chat else "text_completion"
    text_of = oa.token_text(engine.tokenizer, opts.tokens_as_ids)
    per_prompt = [
        (
            s,
            [
                Choice(n * p + i, ids, echo, opts, state.metrics.request(record), text_of)
                for i in range(n)
            ],
        )
        for p, (s, ids, echo) in enumerate(zip(streams, prompts, echoes))
    ]
    if opts.stream:
        return StreamingResponse(
            events(per_prompt, rid, kind, name, chat, opts), media_type="text/event-stream"
        )
    try:
        if not await _unless_disconnected(
            request, asyncio.gather(*(run(s, cs) for s, cs in per_prompt))
        ):
            # (nobody reads it: the client went away, its requests are aborted)
            return Response(status_code=499)
    except EngineDeadError as e:  # a worker died under it (a restart is under way)
        raise HTTPError(503, str(e), "service_unavailable") from None
    finally:
        for s, _ in per_prompt:
            await s.aclose()
    choices = [c for _, cs in per_prompt for c in cs]
    # a grammar that failed in the worker (its compile deadline, say): the request's 400
    for c in choices:
        if c.out is not None and (c.out.error or "").startswith("structured_output"):
            raise structured.rename(RequestError(c.out.error), opts.grammar_field)
    response = {
        "id": rid,
        "object": kind,
        "created": oa.created(),
        "model": name,
        "choices": [c.final(chat) for c in choices],
        "usage": usage([cs for _, cs in per_prompt]),
    }
    if chat and opts.return_token_ids:
        response["prompt_token_ids"] = choices[0].prompt_ids
    if chat and opts.prompt_logprobs is not None:
        response["prompt_logprobs"] = choices[0].prompt_logprobs()
    return Response(_json.encode(response), media_type="application/json")


async def _unless_disconnected(request: Request, work) -> bool:
    """Run `work` until it ends (True) or the client disconnects (False: it is cancelled). A streamed
    response learns of a disconnect from Starlette, which cancels it; a whole one waits here."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()  # (its error, if it failed)
            return True
        return False
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's /tokenize: a prompt, or a chat's messages (through its template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict | None = None
    documents: list[dict] | None = None
    tools: list | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    tokens: list[rq.Int]


async def tokenize(request: Request, body: dict, served: Served) -> dict:
    engine = request.app.state.engine
    with bad_request():
        req = rq.parse(body, TokenizeRequest)
        if (req.prompt is None) == (req.messages is None):
            raise RequestError("prompt: give either prompt or messages")
        if engine.tokenizer is None:
            raise RequestError("prompt: this model has no tokenizer")
        if req.messages is not None:
            add = req.add_special_tokens if req.add_special_tokens is not None else True
            ids, _ = await served.pool.run(chat_template.render, engine, req, served, add)
        else:  # (any length, as vLLM: only generating needs the prompt to fit)
            add = req.add_special_tokens if req.add_special_tokens is not None else True
            ids = (
                await served.pool.run(lambda: engine.tokenizer(req.prompt, add_special_tokens=add))
            ).input_ids
    out = {"count": len(ids), "max_model_len": engine.model_config.max_positions, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = engine.tokenizer.convert_ids_to_tokens(ids)
    return out


async def detokenize(request: Request, body: dict, served: Served) -> dict:
    engine = request.app.state.engine
    with bad_request():
        req = rq.parse(body, DetokenizeRequest)
        if engine.tokenizer is None:
            raise RequestError("tokens: this model has no tokenizer")
        if req.tokens:  # (ids outside the vocabulary: a 400 naming them; none: "")
            engine.tokenize(req.tokens)
        text = await served.pool.run(engine.tokenizer.decode, req.tokens)
    if not isinstance(text, str):
        raise HTTPError(500, f"tokens {short(req.tokens)} did not decode")
    return {"prompt": text}
