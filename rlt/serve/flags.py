"""`rlt serve`'s HTTP flags and the Limits and ServerOptions they make (imported by the CLI: nothing
heavy here)."""

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may ask (rlt/serve/limits.py checks them)."""

    max_body_bytes: int = 4 << 20  # (why 4 MiB: limits.decode())
    body_timeout: float = 30.0
    max_prompts: int = 4096  # choices of one /v1/completions call: prompts x n
    max_tools: int = 128  # a chat's tools (OpenAI's limit)
    chat_template_timeout: float = 2.0  # seconds a chat's rendering may take


@dataclass(frozen=True)
class ServerOptions:
    """What wraps every request (rlt/serve/middleware.py): CORS (none unless an origin is allowed;
    the rest as vLLM's defaults) and the per-request log line."""

    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    log_requests: bool = True
    trust_request_chat_template: bool = False  # a request may give its own chat_template
    # /v1/responses kept for GET, DELETE and previous_response_id (0: none)
    responses_store: int = 0


def _json_list(text: str) -> tuple[str, ...]:
    v = json.loads(text)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(text)
    return tuple(v)


_json_list.__name__ = "JSON list of strings"  # (argparse names the type in its error)


def _positive(kind):
    def parse(text: str):
        v = kind(text)
        if not v > 0:
            raise ValueError(text)
        return v

    parse.__name__ = f"positive {kind.__name__}"  # (argparse names the type in its error)
    return parse


def add_flags(parser) -> None:
    """`rlt serve`'s HTTP bounds. Defaults: keep-alive as uvicorn's and vLLM's; a client sends its
    headers at once, so 10 s only bounds silent or trickling sockets (nginx waits 60 s, Apache 20-40);
    30 s for a 4 MiB body asks ~140 KB/s; 4096 connections is far past what one engine serves at once
    (64 running requests per worker by default) and keeps a flood from exhausting file descriptors
    (the cap is lowered to what `ulimit -n` allows: connections.connection_cap); the body limit: limits.decode()."""
    g = parser.add_argument_group("HTTP limits")
    add = lambda flag, kind, default, text: g.add_argument(  # noqa: E731
        flag, type=_positive(kind), default=default, help=f"{text} (default: {default})"
    )
    add("--max-body-bytes", int, Limits.max_body_bytes, "a larger request body is refused (413)")
    add(
        "--body-timeout",
        float,
        Limits.body_timeout,
        "seconds a request body may take to arrive (then 408)",
    )
    add(
        "--max-prompts",
        int,
        Limits.max_prompts,
        "choices one /v1/completions call may ask for: prompts x n (400)",
    )
    add("--max-tools", int, Limits.max_tools, "tools one chat request may give (400)")
    add(
        "--chat-template-timeout",
        float,
        Limits.chat_template_timeout,
        "seconds a chat template may take to render (400)",
    )
    add("--timeout-keep-alive", float, 5.0, "seconds an idle kept-alive connection stays open")
    add(
        "--header-timeout",
        float,
        10.0,
        "seconds a request's headers may take to arrive before the connection closes",
    )
    add(
        "--max-connections",
        int,
        4096,
        "connections open at once; past it a request gets a 503 with Retry-After",
    )
    add(
        "--shutdown-timeout",
        float,
        5.0,
        "seconds requests in flight may take to finish after SIGTERM/SIGINT before they are failed",
    )


def add_server_flags(parser) -> None:
    """CORS (vLLM's flags; no origin allowed by default) and the request log."""
    g = parser.add_argument_group("CORS and logging")
    g.add_argument(
        "--allowed-origins",
        type=_json_list,
        default=(),
        help="origins a browser may call from, a JSON list such as '[\"https://a.example\"]' or '[\"*\"]' "
        "(default: none, no CORS headers)",
    )
    for flag, text in (("--allowed-methods", "methods"), ("--allowed-headers", "request headers")):
        g.add_argument(
            flag,
            type=_json_list,
            default=("*",),
            help=f'CORS: the {text} allowed, a JSON list (default: ["*"])',
        )
    g.add_argument(
        "--allow-credentials", action="store_true", help="CORS: allow cookies and credentials"
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a request give its own chat_template (rendered under the same bounds; default: refused, 400)",
    )
    g.add_argument(
        "--responses-store",
        type=int,
        default=0,
        metavar="N",
        help="keep the last N /v1/responses in memory, for GET and DELETE /v1/responses/{id} and a later "
        "request's previous_response_id (default: 0, none kept, as vLLM's store is off by default)",
    )
    g.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no INFO line per request on stderr (5xx responses are logged at WARNING still)",
    )


def server_options_of(args) -> ServerOptions:
    return ServerOptions(
        allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
        log_requests=not args.disable_log_requests,
        trust_request_chat_template=args.trust_request_chat_template,
        responses_store=max(0, args.responses_store),
    )


def limits_of(args) -> Limits:
    return Limits(
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        max_prompts=args.max_prompts,
        max_tools=args.max_tools,
        chat_template_timeout=args.chat_template_timeout,
    )


def uvicorn_options(args) -> dict:
    from rlt.serve.connections import connection_cap, protocol

    http = protocol(args.header_timeout, connection_cap(args.max_connections))
    return {"http": http, "timeout_keep_alive": args.timeout_keep_alive}
