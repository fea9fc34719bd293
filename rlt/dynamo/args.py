"""`python -m rlt.dynamo [--role aggregated|decode|prefill] MODEL [Dynamo options] [engine options]`:
one rlt worker as a Dynamo node. Aggregated and decode nodes register MODEL with Dynamo's discovery
(tokens in: Dynamo's frontend renders the chat template and tokenizes with the checkpoint's own
files) and serve NAMESPACE.COMPONENT.ENDPOINT; a decode node's prompts are prefilled by prefill
nodes, which serve NAMESPACE.prefill.generate to decode nodes only (rlt/dynamo/prefill.py). Each
runs until SIGINT/SIGTERM, then drains and stops its rlt worker. Options are checked before
anything starts: a bad one is one line on stderr and exit status 2.

Parsed and checked (the engine's options by rlt.Engine.launch) into the Node to run."""

import argparse
import json
import os
from dataclasses import dataclass

ROLES = ("aggregated", "prefill", "decode")


@dataclass
class Node:
    role: str
    launch: object  # rlt.Engine.launch(...): options checked, nothing started
    args: argparse.Namespace
    served_name: str
    prefill: object = None  # a decode node's PrefillConnector (rlt/dynamo/remote.py DynamoPrefill)
    reasoning_parser: str | None = None  # the one it registers for Dynamo's frontend to run
    config: object = None  # an aggregated or decode node's Dynamo WorkerConfig


def parser() -> argparse.ArgumentParser:
    from rlt.frontends.flags import add_option_flags

    p = argparse.ArgumentParser(prog="python -m rlt.dynamo", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "model", nargs="?", help="checkpoint directory (default: the embedded tiny Ouro)"
    )
    p.add_argument(
        "--role",
        choices=ROLES,
        default="aggregated",
        help="aggregated: prefill and decode, a model to the frontend; decode: a model to the frontend, "
        "prompts prefilled by prefill nodes (KV over NIXL); prefill: serves decode nodes only",
    )
    p.add_argument(
        "--served-model-name", help="the model name clients use (default: MODEL as given)"
    )
    p.add_argument(
        "--hf-overrides", type=json.loads, help="JSON object replacing config.json fields"
    )
    d = p.add_argument_group("Dynamo")
    d.add_argument("--namespace", default="rlt")
    d.add_argument("--component", default="backend")
    d.add_argument("--endpoint", default="generate")
    d.add_argument(
        "--discovery-backend", default="etcd", choices=["etcd", "kubernetes", "file", "mem"]
    )
    d.add_argument("--request-plane", default="tcp", choices=["tcp", "nats"])
    d.add_argument("--event-plane", choices=["zmq", "nats"], help="(default: Dynamo's)")
    from dynamo._core import get_reasoning_parser_names, get_tool_parser_names

    for flag, names, what in (
        (
            "--dyn-tool-call-parser",
            get_tool_parser_names(),
            "tool calls in chat responses into tool_calls",
        ),
        (
            "--dyn-reasoning-parser",
            get_reasoning_parser_names(),
            "<think> blocks into reasoning_content",
        ),
    ):
        d.add_argument(
            flag,
            choices=["auto", "none", *sorted(names)],
            default="auto",
            metavar="{auto,none,<Dynamo's parsers>}",
            help=f"Dynamo's frontend splits {what} (auto: the family's, as rlt serve's: see docs/deploy.md)",
        )
    d.add_argument(
        "--custom-jinja-template",
        help="a Jinja chat template file the frontend renders chat requests with (default: the checkpoint's)",
    )
    add_option_flags(p)
    return p


def parse(argv=None) -> Node:
    """The node `argv` asks for; raises ValueError for a bad option (before anything starts)."""
    from dynamo.common.backend.worker import WorkerConfig

    import rlt
    from rlt.dynamo.remote import DynamoPrefill
    from rlt.frontends.flags import option_values
    from rlt.models.default_model import default_model_path

    args = parser().parse_args(argv)
    template = args.custom_jinja_template
    if template is not None and not os.path.isfile(
        template := os.path.abspath(os.path.expanduser(template))
    ):
        raise ValueError(f"--custom-jinja-template: no file {template}")
    options = option_values(args)
    if "topology" in options:
        raise ValueError(
            "--topology: a Dynamo worker runs one rlt worker; choose its part with --role"
        )
    model = args.model or default_model_path()
    name = args.served_model_name or args.model or "default"
    split = args.role != "aggregated"  # (prefill and decode nodes: the PD options apply)
    prefill = None
    if args.role == "decode":  # its prefill slot: the prefill nodes, through Dynamo
        prefill = DynamoPrefill(
            f"{args.namespace}.prefill.generate", (args.discovery_backend, args.request_plane)
        )
    topology = "1p1d" if split else "single"
    launch = rlt.Engine.launch(
        model, hf_overrides=args.hf_overrides, topology=topology, remote_prefill=prefill, **options
    )
    if args.role == "prefill":
        return Node(args.role, launch, args, name)
    reasoning, tools = parsers(launch.engine, args, template)
    config = WorkerConfig(
        namespace=args.namespace,
        component=args.component,
        endpoint=args.endpoint,
        model_name=launch.engine.model_config.path,
        served_model_name=name,
        discovery_backend=args.discovery_backend,
        request_plane=args.request_plane,
        event_plane=args.event_plane,
        # KV events and load for Dynamo's KV router (rlt/dynamo/router_state.py)
        enable_kv_routing=True,
        custom_jinja_template=template,
        tool_call_parser=tools,
        reasoning_parser=reasoning,
    )
    return Node(args.role, launch, args, name, prefill, reasoning, config)


def parsers(engine, args, template: str | None) -> tuple[str | None, str | None]:
    """(reasoning parser, tool-call parser) the node registers for Dynamo's frontend to run: auto is
    the family's default for its chat template, as `rlt serve`'s (rlt/frontends/parsers.py)."""
    from rlt.frontends.parsers import default_parsers
    from rlt.models.family import FAMILIES

    chosen = (args.dyn_reasoning_parser, args.dyn_tool_call_parser)
    auto = (None, None)
    if "auto" in chosen:
        engine.load_tokenizer()  # (idempotent: the launch does not load it again)
        tok = engine.tokenizer
        if template is not None:
            with open(template) as f:
                template = f.read()
        else:
            template = getattr(tok, "chat_template", None)
        family = FAMILIES[engine.model_config.model_type].name
        vocab = tok.get_vocab() if tok is not None else None
        auto = default_parsers(family, template if isinstance(template, str) else None, vocab)
    return tuple(a if c == "auto" else None if c == "none" else c for c, a in zip(chosen, auto))
