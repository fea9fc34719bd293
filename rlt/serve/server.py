"""`rlt serve [MODEL] --host H --port P [engine options]`: launch the engine (options checked, one
line on error, before anything starts), then serve it with uvicorn on uvloop; the URL is printed
once every worker is READY and the port is listening.
SIGTERM or SIGINT shuts it down with a deadline (rlt/serve/shutdown.py)."""

import argparse
import json
import os

from rlt.serve.flags import add_flags as add_http_flags


def add_parser(sub, add_option_flags) -> None:
    s = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API")
    s.add_argument(
        "model", nargs="?", help="checkpoint directory or Hugging Face Hub id (default: the embedded tiny Ouro)"
    )
    g = s.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0: every one)")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    g.add_argument("--revision", help="the hub id's branch, tag or commit (default: main)")
    g.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes (default: none)")
    g.add_argument(
        "--served-model-name",
        help="the model name clients use (default: MODEL as given; 'default' for the embedded model)",
    )
    g.add_argument("--hf-overrides", type=json.loads, help="JSON object replacing config.json fields")
    g.add_argument(
        "--generation-config",
        choices=["auto", "none"],
        default="auto",
        help="auto: requests default to generation_config.json's temperature, top_p, top_k, max_new_tokens "
        "(default: auto)",
    )
    g.add_argument("--override-generation-config", type=json.loads, default={}, help="JSON object over those defaults")
    add_http_flags(s)
    add_option_flags(s)


def sampling_defaults(path: str, source: str, overrides: dict) -> dict:
    """generation_config.json's sampling fields (source "auto"), then the overrides."""
    from rlt.config import read_json_object
    from rlt.errors import ConfigError
    from rlt.serve.openai_api import GENERATION_DEFAULTS

    if not isinstance(overrides, dict) or set(overrides) - set(GENERATION_DEFAULTS):
        raise ConfigError(f"--override-generation-config takes an object of {', '.join(GENERATION_DEFAULTS)}")
    file = os.path.join(path, "generation_config.json")
    found = read_json_object(file) if source == "auto" and os.path.isfile(file) else {}
    return {k: found[k] for k in GENERATION_DEFAULTS if found.get(k) is not None} | overrides


def serve(args: argparse.Namespace, options: dict) -> int:
    import uvicorn

    from rlt.control.frontend import Engine
    from rlt.serve.app import build_app
    from rlt.serve.flags import limits_of, uvicorn_options
    from rlt.serve.shutdown import Server

    launch = Engine.launch(
        args.model, hf_overrides=args.hf_overrides, revision=args.revision, **options
    )  # checks every option
    launch.engine.load_tokenizer()
    defaults = sampling_defaults(
        launch.engine.model_config.path, args.generation_config, args.override_generation_config
    )
    name = args.served_model_name or args.model or "default"

    app = build_app(lambda: launch, name, args.api_key, defaults, limits_of(args))
    config = uvicorn.Config(
        app, host=args.host, port=args.port, loop="uvloop", log_level="warning", **uvicorn_options(args)
    )
    server = Server(config, launch.engine, args.shutdown_timeout, f"rlt serve: {name} ready at {url(args)}")
    server.run()
    return server.exit_code


def url(args) -> str:
    return f"http://{args.host}:{args.port}/v1"
