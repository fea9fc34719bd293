"""`rlt serve [MODEL] --host H --port P [engine options]`: launch the engine (options checked, one
line on error, before anything starts), then serve it with uvicorn on uvloop; the URL is printed
once every worker is READY. Ctrl-C shuts the engine down (no worker outlives the server)."""

import argparse


def add_parser(sub, add_option_flags) -> None:
    s = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API")
    s.add_argument("model", nargs="?", help="checkpoint directory (default: the embedded tiny Ouro)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 routes")
    s.add_argument("--served-model-name", help="the model name clients use (default: MODEL as given)")
    s.add_argument("--hf-overrides", type=__import__("json").loads, help="JSON object replacing config.json fields")
    add_option_flags(s)


def serve(args: argparse.Namespace, options: dict) -> int:
    import uvicorn

    from rlt.control.frontend import Engine
    from rlt.serve.app import build_app

    launch = Engine.launch(args.model, hf_overrides=args.hf_overrides, **options)  # checks every option
    launch.engine.load_tokenizer()
    name = args.served_model_name or args.model or "default"

    def ready(engine) -> None:
        print(f"rlt serve: {name} ready at http://{args.host}:{args.port}/v1", flush=True)

    app = build_app(lambda: launch, name, args.api_key, ready)
    config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", log_level="warning")
    uvicorn.Server(config).run()
    return 0
