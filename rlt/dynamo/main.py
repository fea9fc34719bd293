"""`python -m rlt.dynamo [--role aggregated] MODEL [Dynamo options] [rlt engine options]`: one rlt
engine served as a Dynamo worker. It registers MODEL with Dynamo's discovery (tokens in: Dynamo's
frontend renders the chat template and tokenizes with the checkpoint's own files) and serves
`generate` at NAMESPACE.COMPONENT.ENDPOINT until SIGINT/SIGTERM (Dynamo's worker owns the signals,
drains, then shuts the rlt engine down). Options are checked before anything starts: a bad one
is one line on stderr and exit status 2."""

import argparse
import json
import sys

ROLES = ("aggregated",)


def parser() -> argparse.ArgumentParser:
    from rlt.cli import add_option_flags

    p = argparse.ArgumentParser(prog="python -m rlt.dynamo", description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="checkpoint directory (default: the embedded tiny Ouro)")
    p.add_argument("--role", choices=ROLES, default="aggregated", help="what this worker does")
    p.add_argument("--served-model-name", help="the model name clients use (default: MODEL as given)")
    p.add_argument("--hf-overrides", type=json.loads, help="JSON object replacing config.json fields")
    d = p.add_argument_group("Dynamo")
    d.add_argument("--namespace", default="rlt")
    d.add_argument("--component", default="backend")
    d.add_argument("--endpoint", default="generate")
    d.add_argument("--discovery-backend", default="etcd", choices=["etcd", "kubernetes", "file", "mem"])
    d.add_argument("--request-plane", default="tcp", choices=["tcp", "nats"])
    d.add_argument("--event-plane", choices=["zmq", "nats"], help="(default: Dynamo's)")
    add_option_flags(p)
    return p


def parse(argv=None):
    """-> (RltEngine, WorkerConfig); raises ValueError for a bad option (before anything starts)."""
    from dynamo.common.backend.worker import WorkerConfig

    from rlt.cli import option_values
    from rlt.default_model import default_model_path
    from rlt.dynamo.engine import RltEngine

    args = parser().parse_args(argv)
    options = option_values(args)
    if options.get("topology", "single") != "single":
        raise ValueError("--topology: a Dynamo worker runs one engine; choose its part with --role")
    model = args.model or default_model_path()
    name = args.served_model_name or args.model or "default"
    engine = RltEngine(model, name, args.hf_overrides, options)
    config = WorkerConfig(
        namespace=args.namespace,
        component=args.component,
        endpoint=args.endpoint,
        model_name=engine.engine_path,
        served_model_name=name,
        discovery_backend=args.discovery_backend,
        request_plane=args.request_plane,
        event_plane=args.event_plane,
        enable_kv_routing=False,  # rlt publishes no KV events (yet): routing is by load
    )
    return engine, config


def main(argv=None) -> int:
    from dynamo.common.backend.run import run

    from rlt.dynamo.engine import RltEngine

    try:
        built = parse(argv)
    except ValueError as e:  # ConfigError / RequestError included: one line, as `rlt serve`
        print(f"python -m rlt.dynamo: {e}", file=sys.stderr)
        return 2

    async def factory(_argv):
        return built

    run(RltEngine, argv, engine_factory=factory)
    return 0
