"""The `rlt` command: `rlt generate`, `rlt serve`, `rlt make-checkpoint` and `rlt bench` (rlt/bench/cli.py)."""

import argparse
import json
import sys
import time

from rlt.contract.fields import field_names, option_fields
from rlt.errors import CheckpointError, ConfigError, EngineDeadError, RequestError
from rlt.frontends.flags import add_option_flags, option_values

# a prompt this long gets a line on stderr when its prefill starts and ends
LONG_PROMPT_TOKENS = 2048


def _token_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids, got {text!r}"
        ) from None


class _PromptAction(argparse.Action):
    """--prompt and --prompt-token-ids append to one list, keeping their command-line order."""

    def __call__(self, parser, ns, value, option_string=None):
        prompts = getattr(ns, "prompts", None) or []
        prompts.append(value)
        ns.prompts = prompts


def _add_generate(sub):
    g = sub.add_parser("generate", help="generate continuations of prompts")
    g.add_argument(
        "--model",
        help="checkpoint directory or Hugging Face Hub id (default: the embedded tiny Ouro)",
    )
    g.add_argument("--revision", help="the hub id's branch, tag or commit (default: main)")
    g.add_argument(
        "--prompt",
        action=_PromptAction,
        dest="prompts",
        type=str,
        help="a text prompt (repeatable)",
    )
    g.add_argument(
        "--prompt-token-ids",
        action=_PromptAction,
        dest="prompts",
        type=_token_ids,
        help="a prompt as comma-separated token ids (repeatable)",
    )
    g.add_argument(
        "--hf-overrides", type=json.loads, help="JSON object replacing config.json fields"
    )
    g.add_argument("--json", action="store_true", help="one JSON object per prompt, one per line")
    _add_sampling_flags(g.add_argument_group("sampling (rlt.SamplingParams)"))
    add_option_flags(g)


def _logit_bias(text: str) -> dict[int, float]:
    try:
        bias = json.loads(text)
        return {int(k): v for k, v in bias.items()}
    except (ValueError, AttributeError):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object of token id -> bias, got {text!r}"
        ) from None


def _structured_output(text: str):
    import msgspec

    from rlt.contract.sampling_params import StructuredOutput

    try:
        return msgspec.json.decode(text, type=StructuredOutput)
    except msgspec.DecodeError as e:
        raise argparse.ArgumentTypeError(
            f"expected a JSON structured output, got {text!r}: {e}"
        ) from None


# rlt generate's own defaults where they differ from SamplingParams' (a command line is read by a
# person: greedy)
GENERATE_DEFAULTS = {"temperature": 0.0, "stop_token_ids": [], "stop": [], "logit_bias": {}}
# fields whose values are not one scalar: (type, how the help shows it)
_COMPOUND = {
    "stop_token_ids": (_token_ids, "comma-separated"),
    "logit_bias": (_logit_bias, 'JSON, e.g. {"42": -5}'),
    "structured_output": (_structured_output, 'JSON, e.g. {"regex": "[0-9]+"} or {"json": {...}}'),
}


# request fields whose engine option of the same name is the command's flag (its requests take it)
ENGINE_SET = ("speculative_loops", "speculative_tokens")


def _add_sampling_flags(group) -> None:
    """One flag per SamplingParams field, its help the field's description."""
    from rlt.contract.sampling_params import SamplingParams

    for name, kind, default, doc in option_fields(SamplingParams):
        if name in ENGINE_SET:
            continue
        flag, default = "--" + name.replace("_", "-"), GENERATE_DEFAULTS.get(name, default)
        text = doc if default is None or "default" in doc else f"{doc} (default: {default})"
        if kind is bool:
            action = argparse.BooleanOptionalAction if default else "store_true"
            group.add_argument(flag, action=action, default=default, help=text)
        elif name in _COMPOUND:
            kind, how = _COMPOUND[name]
            group.add_argument(flag, type=kind, default=default, help=f"{doc} ({how})")
        elif name == "stop":
            group.add_argument(flag, action="append", default=[], help=f"{doc} (repeatable)")
        else:
            group.add_argument(flag, type=kind, default=default, help=text)


def _add_make_checkpoint(sub):
    from rlt.models.family import BY_NAME

    m = sub.add_parser(
        "make-checkpoint", help="write a random-weight checkpoint in an official schema"
    )
    m.add_argument("--family", required=True, choices=list(BY_NAME), help="the model family")
    m.add_argument("--out", required=True, help="the directory to write (created)")
    m.add_argument(
        "--preset",
        default="tiny",
        choices=["tiny", "full"],
        help="tiny: a few MB for tests; full: the official shapes (default: tiny)",
    )
    m.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    m.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 for tiny, bfloat16 for full",
    )
    m.add_argument("--shards", type=int, help="number of safetensors shards (default: ~4 GB each)")
    m.add_argument(
        "--device",
        default="cpu",
        help="where to draw the random weights (cuda: fast for full; default: cpu)",
    )
    m.add_argument(
        "--update-scale",
        type=float,
        default=1.0,
        help="scale of each loop's change to the state (its output projections and norm deviations): below 1 "
        "a token's first loops agree more often with its last, which sets self-speculation's acceptance "
        "(default: 1)",
    )


def generate(args) -> int:
    import asyncio

    from rlt.contract.sampling_params import SamplingParams
    from rlt.control.frontend import Engine
    from rlt.control.run import run_command

    if not args.prompts:
        raise RequestError("give at least one --prompt or --prompt-token-ids")
    sp = SamplingParams(
        **{
            name: getattr(args, name)
            for name in field_names(SamplingParams)
            if name not in ENGINE_SET
        }
    )
    try:
        launch = Engine.launch(
            args.model,
            hf_overrides=args.hf_overrides,
            revision=args.revision,
            **option_values(args),
        )
    except ValueError as e:
        if isinstance(e, (RequestError, ConfigError, CheckpointError)):
            raise
        raise RequestError(str(e)) from e
    engine = launch.engine
    from rlt.contract.validation import output_options, resolve_params

    # Every prompt is validated before any process is spawned: the options and token ids before the
    # tokenizer loads (a bad flag is refused without transformers' import), text prompts after.
    output_options(sp)

    def checked(prompt) -> list[int]:
        ids = engine.tokenize(prompt)
        resolve_params(engine.model_config, len(ids), sp)
        return ids

    given = [None if isinstance(p, str) else checked(p) for p in args.prompts]
    engine.load_tokenizer(grammars=sp.structured_output is not None)
    requests = [
        (str(i), checked(p) if ids is None else ids)
        for i, (p, ids) in enumerate(zip(args.prompts, given))
    ]

    async def run():
        t0, terminal = time.monotonic(), sys.stderr.isatty()
        if terminal:  # (a full-size checkpoint takes a while to load and warm up on a CPU)
            lc = engine.launch_config
            print(f"rlt: starting {lc.topology} on {lc.device}", file=sys.stderr)
        async with launch:
            if terminal:
                print(
                    f"rlt: ready after {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True
                )

            async def one(rid, ids):
                finals, long, t0 = {}, len(ids) >= LONG_PROMPT_TOKENS, time.monotonic()
                if long:
                    print(
                        f"rlt: prompt {rid}: prefilling {len(ids):,} tokens",
                        file=sys.stderr,
                        flush=True,
                    )
                async for out in engine.generate(ids, sp, request_id=rid):
                    if long and not finals:
                        print(
                            f"rlt: prompt {rid}: first token after {time.monotonic() - t0:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                    finals[out.index] = out
                return [finals[i] for i in sorted(finals)]

            return await asyncio.gather(*(one(rid, ids) for rid, ids in requests))

    outs = [out for choices in run_command(run()) for out in choices]
    for out in outs:
        if args.json:
            print(json.dumps(out.to_json()), flush=True)
        else:
            prompt_text = (
                engine.tokenizer.decode(out.prompt_token_ids)
                if engine.tokenizer
                else str(out.prompt_token_ids)
            )
            print(
                f"[{out.request_id}] {prompt_text!r} -> {out.text!r}  ({out.finish_reason}; "
                f"{len(out.token_ids)} tokens, exit depths {out.exit_depths})",
                flush=True,
            )
    return 0


def make_checkpoint_cmd(args) -> int:
    from rlt.models.checkpoint import make_checkpoint

    path = make_checkpoint(
        args.family,
        args.out,
        preset=args.preset,
        seed=args.seed,
        dtype=args.dtype,
        num_shards=args.shards,
        device=args.device,
        update_scale=args.update_scale,
    )
    print(path)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlt")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "(source tree, not installed)"


def build_parser() -> argparse.ArgumentParser:
    from rlt.bench.cli import add_parser as add_bench
    from rlt.serve.server import add_parser

    parser = argparse.ArgumentParser(
        prog="rlt", description="serving engine for looped language models"
    )
    parser.add_argument("--version", action="version", version=f"rlt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    add_parser(sub)
    _add_make_checkpoint(sub)
    add_bench(sub)
    return parser


def main(argv=None) -> int:
    from rlt.serve.server import serve

    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args, option_values(args))
        if args.command == "bench":
            from rlt.bench.cli import run

            return run(args)
        return generate(args) if args.command == "generate" else make_checkpoint_cmd(args)
    except (RequestError, ConfigError, CheckpointError) as e:
        print(f"rlt: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # an option out of its range (Engine.launch names it)
        print(f"rlt: error: {e}", file=sys.stderr)
        return 2
    except (EngineDeadError, RuntimeError, TimeoutError) as e:
        print(f"rlt: error: {e}", file=sys.stderr)
        return 1
    # the engine was shut down on the way out: workers and temp files gone
    except KeyboardInterrupt:
        print("rlt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
