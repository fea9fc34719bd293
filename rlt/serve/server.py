"""`rlt serve [MODEL] --host H --port P [engine options]`: bind and listen on the port first (a busy
one: one line and exit 2 before anything loads), launch the engine (options checked, one line on
error, before any worker starts), then serve it with uvicorn on uvloop on that socket; the URL is
printed once every worker is READY. rlt's log (a line per request, warnings) goes to stderr.
SIGTERM or SIGINT shuts it down with a deadline (rlt/serve/shutdown.py)."""

import argparse
import json
import logging
import os
import socket
import sys

from rlt.frontends.flags import add_option_flags
from rlt.serve.flags import add_flags as add_http_flags
from rlt.serve.flags import add_server_flags

BACKLOG = 2048  # uvicorn's default: connections the kernel holds before the server accepts them


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API")
    s.add_argument(
        "model",
        nargs="?",
        help="checkpoint directory or Hugging Face Hub id (default: the embedded tiny Ouro)",
    )
    g = s.add_argument_group("server")
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; 0.0.0.0: every one)",
    )
    g.add_argument(
        "--port",
        type=_port,
        default=8000,
        help="port to listen on (default: 8000; 0: any free one)",
    )
    g.add_argument("--revision", help="the hub id's branch, tag or commit (default: main)")
    g.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on every route but /health (default: none)",
    )
    g.add_argument(
        "--served-model-name",
        nargs="+",
        help="the model names clients may use; responses and metrics name the first (default: MODEL as given; "
        "'default' for the embedded model)",
    )
    g.add_argument(
        "--hf-overrides", type=json.loads, help="JSON object replacing config.json fields"
    )
    g.add_argument(
        "--generation-config",
        choices=["auto", "none"],
        default="auto",
        help="auto: requests default to generation_config.json's temperature, top_p, top_k, max_new_tokens "
        "(default: auto)",
    )
    g.add_argument(
        "--override-generation-config",
        type=json.loads,
        default={},
        help="JSON object over those defaults",
    )
    g.add_argument(
        "--chat-template",
        help="a Jinja chat template, or the file holding one, for requests that give none (default: the checkpoint's)",
    )
    from rlt.frontends.parsers import REASONING_PARSERS, TOOL_PARSERS

    for flag, names, what in (
        ("--reasoning-parser", REASONING_PARSERS, "<think> blocks into reasoning_content"),
        ("--tool-call-parser", TOOL_PARSERS, "tool calls into tool_calls"),
    ):
        g.add_argument(
            flag,
            choices=["auto", "none", *names],
            default="auto",
            help=f"split chat responses' {what} (default: auto, the family's: see docs/serve.md)",
        )
    add_http_flags(s)
    add_server_flags(s)
    add_option_flags(s)


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise ValueError(text)
    return v


_port.__name__ = "port (0 to 65535)"


def sampling_defaults(path: str, source: str, overrides: dict) -> dict:
    """generation_config.json's sampling fields (source "auto"), then the overrides."""
    from rlt.errors import ConfigError
    from rlt.models.json_object import read_json_object
    from rlt.serve.requests import GENERATION_DEFAULTS

    if not isinstance(overrides, dict) or set(overrides) - set(GENERATION_DEFAULTS):
        raise ConfigError(
            f"--override-generation-config takes an object of {', '.join(GENERATION_DEFAULTS)}"
        )
    file = os.path.join(path, "generation_config.json")
    found = read_json_object(file) if source == "auto" and os.path.isfile(file) else {}
    return {k: found[k] for k in GENERATION_DEFAULTS if found.get(k) is not None} | overrides


def serve(args: argparse.Namespace, options: dict) -> int:
    try:
        sock = listen(args.host, args.port)
    except (OSError, OverflowError) as e:  # in use, not this host's address, a privileged port, ...
        print(
            f"rlt: error: cannot listen on {address(args.host, args.port)}: {getattr(e, 'strerror', None) or e}",
            file=sys.stderr,
        )
        return 2
    try:
        return _serve(args, options, sock)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, options: dict, sock: socket.socket) -> int:
    import uvicorn

    from rlt.control.frontend import Engine
    from rlt.serve.app import build_app
    from rlt.serve.flags import limits_of, server_options_of, uvicorn_options
    from rlt.serve.shutdown import Server

    _log_to_stderr()
    launch = Engine.launch(
        args.model, hf_overrides=args.hf_overrides, revision=args.revision, **options
    )  # checks every option
    launch.engine.load_tokenizer()
    defaults = sampling_defaults(
        launch.engine.model_config.path, args.generation_config, args.override_generation_config
    )
    names = args.served_model_name or [args.model or "default"]
    template = chat_template(args.chat_template)
    parsers = parsers_of(args, launch.engine, template)
    app = build_app(
        lambda: launch,
        names,
        args.api_key,
        defaults,
        limits_of(args),
        template,
        server_options_of(args),
        parsers,
    )
    config = uvicorn.Config(
        app,
        loop="uvloop",
        log_level="warning",
        access_log=False,
        backlog=BACKLOG,
        **uvicorn_options(args),
    )
    url = f"http://{address(args.host, sock.getsockname()[1])}/v1"
    server = Server(
        config, launch.engine, args.shutdown_timeout, f"rlt serve: {names[0]} ready at {url}"
    )
    server.run(sockets=[sock])
    return server.exit_code


def parsers_of(args, engine, template: str | None) -> tuple[str | None, str | None]:
    """--reasoning-parser and --tool-call-parser: auto is the family's default for its template."""
    from rlt.frontends.parsers import default_parsers
    from rlt.models.family import FAMILIES

    tok = engine.tokenizer
    template = template or getattr(tok, "chat_template", None)
    family = FAMILIES[engine.model_config.model_type].name
    auto = default_parsers(
        family, template if isinstance(template, str) else None, tok.get_vocab() if tok else None
    )
    chosen = (args.reasoning_parser, args.tool_call_parser)
    return tuple(a if c == "auto" else None if c == "none" else c for c, a in zip(chosen, auto))


def chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, else the value itself (as vLLM: a path, or the template inline)."""
    if value is None or not os.path.isfile(value):
        return value
    with open(value) as f:
        return f.read()


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound and listening before the model loads: a port in use is found at
    once, and connections made while the workers start wait in the backlog (as vLLM's)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # (as uvicorn: a port in TIME_WAIT is free)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _log_to_stderr() -> None:
    """rlt's loggers at INFO to stderr: a line per request (rlt.serve), the engine's warnings."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    log = logging.getLogger("rlt")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
