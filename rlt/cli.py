"""The `rlt` command: `rlt generate` and `rlt make-checkpoint`."""

import argparse
import json
import sys

from rlt.errors import CheckpointError, ConfigError, RequestError


def _token_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}")


class _PromptAction(argparse.Action):
    """--prompt and --prompt-token-ids append to one list, keeping their command-line order."""

    def __call__(self, parser, ns, value, option_string=None):
        prompts = getattr(ns, "prompts", None) or []
        prompts.append(value)
        ns.prompts = prompts


def _add_generate(sub):
    g = sub.add_parser("generate", help="generate continuations of prompts")
    g.add_argument("--model", help="checkpoint directory (default: the embedded tiny Ouro)")
    g.add_argument("--prompt", action=_PromptAction, dest="prompts", type=str, help="a text prompt (repeatable)")
    g.add_argument("--prompt-token-ids", action=_PromptAction, dest="prompts", type=_token_ids,
                   help="a prompt as comma-separated token ids (repeatable)")
    g.add_argument("--max-tokens", type=int, default=16)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default here)")
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int)
    g.add_argument("--min-loops", type=int)
    g.add_argument("--max-loops", type=int)
    g.add_argument("--exit-threshold", type=float)
    g.add_argument("--logprobs", type=int)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--stop-token-ids", type=_token_ids, default=[])
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    g.add_argument("--hf-overrides", type=json.loads, help="JSON object replacing config.json fields")
    g.add_argument("--topology", default="single", choices=["single"])
    g.add_argument("--json", action="store_true", help="one JSON object per prompt, one per line")
    g.add_argument("--kv-layout", default="last_exited", choices=["last_exited", "shared"])
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-blocks", type=int, help="KV blocks in the pool (default: sized from 1 GiB)")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--prefill-chunk", type=int, default=256)


def _add_make_checkpoint(sub):
    m = sub.add_parser("make-checkpoint", help="write a random-weight checkpoint in an official schema")
    m.add_argument("--family", required=True, choices=["ouro", "nanbeige", "huginn"])
    m.add_argument("--out", required=True)
    m.add_argument("--preset", default="tiny", choices=["tiny", "full"])
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: float32 for tiny, bfloat16 for full")
    m.add_argument("--shards", type=int, help="number of safetensors shards (default: ~4 GB each)")


def generate(args) -> int:
    from rlt.config import ModelConfig
    from rlt.control.validation import resolve_params, validate_prompt
    from rlt.default_model import default_model_path
    from rlt.models.loader import load_model, resolve_dtype
    from rlt.models.tokenizer import load_tokenizer
    from rlt.outputs import RequestOutput
    from rlt.sampling_params import SamplingParams
    from rlt.workers.engine import EngineConfig, LoopEngine

    if not args.prompts:
        raise RequestError("give at least one --prompt or --prompt-token-ids")
    mc = ModelConfig.from_pretrained(args.model or default_model_path(), hf_overrides=args.hf_overrides)
    tokenizer = load_tokenizer(mc.path)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed, min_loops=args.min_loops, max_loops=args.max_loops,
                        exit_threshold=args.exit_threshold, stop_token_ids=args.stop_token_ids,
                        ignore_eos=args.ignore_eos, logprobs=args.logprobs)
    requests = []  # validate everything before loading any weights
    for prompt in args.prompts:
        if isinstance(prompt, str):
            if tokenizer is None:
                raise RequestError(f"{mc.path} has no tokenizer.json: give --prompt-token-ids instead of --prompt")
            prompt = tokenizer(prompt).input_ids
        ids = validate_prompt(mc, prompt)
        requests.append((ids, resolve_params(mc, len(ids), sp)))
    dtype = resolve_dtype(args.dtype, args.device, mc)
    for name in ("block_size", "max_num_seqs", "prefill_chunk", "num_blocks"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise RequestError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    cfg = EngineConfig(kv_layout=args.kv_layout, block_size=args.block_size, num_blocks=args.num_blocks,
                       max_num_seqs=args.max_num_seqs, prefill_chunk=args.prefill_chunk)
    engine = LoopEngine(mc, load_model(mc, dtype, args.device), cfg, dtype, args.device)
    outs = {}
    for i, (ids, params) in enumerate(requests):
        engine.add_request(str(i), ids, params)
        outs[str(i)] = RequestOutput(str(i), ids, logprobs=[] if params.logprobs else None)
    while engine.has_work():
        for o in engine.step():
            out = outs[o.request_id]
            out.token_ids.append(o.token_id)
            out.exit_depths.append(o.exit_depth)
            if out.logprobs is not None:
                out.logprobs.append(o.logprobs)
            out.finished, out.finish_reason = o.finish_reason is not None, o.finish_reason
    for out in outs.values():
        out.text = tokenizer.decode(out.token_ids, skip_special_tokens=True) if tokenizer else ""
        if args.json:
            print(json.dumps(out.to_json()), flush=True)
        else:
            prompt_text = tokenizer.decode(out.prompt_token_ids) if tokenizer else str(out.prompt_token_ids)
            print(f"[{out.request_id}] {prompt_text!r} -> {out.text!r}  ({out.finish_reason}; "
                  f"{len(out.token_ids)} tokens, exit depths {out.exit_depths})", flush=True)
    return 0


def make_checkpoint_cmd(args) -> int:
    from rlt.models.checkpoint import make_checkpoint

    path = make_checkpoint(args.family, args.out, preset=args.preset, seed=args.seed, dtype=args.dtype,
                           num_shards=args.shards)
    print(path)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rlt", description="serving engine for looped language models")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_make_checkpoint(sub)
    args = parser.parse_args(argv)
    try:
        return generate(args) if args.command == "generate" else make_checkpoint_cmd(args)
    except (RequestError, ConfigError, CheckpointError) as e:
        print(f"rlt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
