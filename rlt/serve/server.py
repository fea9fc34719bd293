"""`rlt serve [MODEL] --host H --port P [engine options]`: launch the engine (options checked, one
line on error, before anything starts), then serve it with uvicorn on uvloop; the URL is printed
once every worker is READY. Ctrl-C shuts the engine down (no worker outlives the server)."""

import argparse
import json
import os


def add_parser(sub, add_option_flags) -> None:
    s = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API")
    s.add_argument("model", nargs="?", help="checkpoint directory (default: the embedded tiny Ouro)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes")
    s.add_argument("--served-model-name", help="the model name clients use (default: MODEL as given)")
    s.add_argument("--hf-overrides", type=json.loads, help="JSON object replacing config.json fields")
    s.add_argument(
        "--generation-config",
        choices=["auto", "none"],
        default="auto",
        help="auto: requests default to generation_config.json's temperature, top_p, top_k, max_new_tokens",
    )
    s.add_argument("--override-generation-config", type=json.loads, default={}, help="JSON object over those defaults")
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

    launch = Engine.launch(args.model, hf_overrides=args.hf_overrides, **options)  # checks every option
    launch.engine.load_tokenizer()
    defaults = sampling_defaults(
        launch.engine.model_config.path, args.generation_config, args.override_generation_config
    )
    name = args.served_model_name or args.model or "default"

    def ready(engine) -> None:
        print(f"rlt serve: {name} ready at http://{args.host}:{args.port}/v1", flush=True)

    app = build_app(lambda: launch, name, args.api_key, defaults, ready)
    config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", log_level="warning")
    uvicorn.Server(config).run()
    return 0
