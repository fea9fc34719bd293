"""`rlt bench`: offline, serve, prefix, first-use, profile, grammar, parity, kv-handoff and gemm (as
`vllm bench`). The parsers only: each command's run is the function RUNS names, imported when it
runs (`rlt --help` loads no torch)."""

import argparse

DESCRIPTION = {
    "offline": "decode throughput and exit depth of one in-process worker engine (every request at once; random "
    "prompts, greedy, EOS ignored), prefill latency by prompt length, and on CUDA both against floors measured "
    "in the same run (--floors)",
    "serve": "Poisson arrivals or closed loops into rlt.Engine in process, or over HTTP into any "
    "OpenAI-compatible server (--base-url), with vLLM's metric names (TTFT, TPOT, ITL, E2EL)",
    "prefix": "a second chat turn's time to first token on a cached prefix against a cold prompt of the same "
    "length (rlt.Engine, default options)",
    "first-use": "CUDA-graph captures and Triton compilations after READY, per phase of a mixed workload "
    "(rlt.Engine; all zero when warm-up covered them)",
    "profile": "where a decode step's time goes, by cProfile over the steps of one in-process "
    "worker engine whose requests all keep decoding, and with --gpu first the GPU's side (CUDA: "
    "ms per step, GPU busy and idle, the kernels adding the most busy time)",
    "grammar": "what structured output costs, through rlt.Engine: decode tok/s of streams "
    "constrained by a JSON schema against free ones, a cached schema's added TTFT, and free "
    "streams' inter-token latency while requests with new schemas arrive",
    "parity": "a topology (e.g. 1p1d) against single, token for token: greedy prompts one at a "
    "time and all at once; per mode the requests equal in tokens and exit depths, and each "
    "other's first divergence",
    "gemm": "the few-row products of decode passes (1 to 32 rows, the families' projections) through "
    "cuBLAS, the one-row GEMV and the skinny GEMM's configs, as the engine launches them (CUDA)",
    "kv-handoff": "KV handoff bandwidth, one prompt's KV blocks written by NIXL from one "
    "process's pool into another's through rlt's KVTransport (the path PD uses), the blocks "
    "consecutive and scattered",
}
RUNS = {  # command: (module of rlt.bench, function)
    "offline": ("commands", "offline"),
    "serve": ("commands", "serve"),
    "prefix": ("phases", "prefix"),
    "first-use": ("phases", "first_use"),
    "profile": ("profile", "profile"),
    "grammar": ("grammar", "grammar"),
    "parity": ("parity", "command"),
    "kv-handoff": ("kv_handoff", "command"),
    "gemm": ("gemm", "command"),
}


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks: " + ", ".join(RUNS), description=__doc__)
    cmds = b.add_subparsers(dest="bench_command", required=True, metavar="{" + ",".join(RUNS) + "}")
    adds = (_offline, _serve, _prefix, _first_use, _profile, _grammar, _parity, _kv_handoff, _gemm)
    for name, add in zip(RUNS, adds, strict=True):
        p = cmds.add_parser(
            name, help=DESCRIPTION[name].split(",")[0], description=DESCRIPTION[name]
        )
        add(p)


def _common(
    p, device="cpu", model_help="checkpoint directory (default: the embedded tiny Ouro)"
) -> None:
    p.add_argument("--model", help=model_help)
    p.add_argument("--device", default=device, help=f"cpu, cuda or cuda:N (default: {device})")


def _record(p) -> None:
    p.add_argument("--dtype", help="default: the engine's (bf16 on CUDA)")
    p.add_argument("--kv-gib", type=float, help="KV pool size in GiB per worker")
    p.add_argument(
        "--kernels",
        choices=("triton", "reference"),
        default="triton",
        help="CUDA: the Triton kernels and CUDA graphs, or the plain torch reference (default: triton)",
    )
    p.add_argument("--commit", help="recorded in the JSON (default: git rev-parse --short HEAD)")
    p.add_argument("--json-out", help="write the results as JSON here")


def _offline(p) -> None:
    _common(
        p,
        model_help="checkpoint directory (default: a random one of --family and --preset, made once)",
    )
    p.add_argument("--family", default="ouro", help="without --model (default: ouro)")
    p.add_argument(
        "--preset", default="tiny", choices=("tiny", "full"), help="without --model (default: tiny)"
    )
    p.add_argument(
        "--concurrency", default="1,16", help="requests at once, one row each (default: 1,16)"
    )
    p.add_argument(
        "--threshold",
        default="1.0,0.5",
        help="exit thresholds, one row each: Ouro's gate's, Huginn's criterion:threshold, or depth:k (every "
        "token at depth k) (e.g. 1.0,kl:0.3,latent-diff:0.4,depth:8; default: 1.0,0.5)",
    )
    p.add_argument(
        "--prompt-len",
        default="32",
        help="prompt lengths, one engine each (e.g. 1024,8192; default: 32)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="default: 32")
    p.add_argument("--kv-layout", default="last_exited", help="default: last_exited")
    _record(p)
    p.add_argument(
        "--cuda-graph-max-batch", type=int, default=256, help="0: eager decode (default: 256)"
    )
    p.add_argument(
        "--steady-decode",
        choices=("adaptive", "always", "never"),
        default="adaptive",
        help="device-side decode lanes: where a request can exit early (the default), always, never",
    )
    p.add_argument(
        "--penalties",
        action="store_true",
        help="each row twice: unpenalized, then every request penalized (repetition 1.1, presence 0.5, "
        "frequency 0.5), with the penalized/unpenalized ratio of decode tok/s",
    )
    p.add_argument(
        "--exit-wait-passes",
        default="8",
        help="Huginn's criteria: passes an exited token may wait for others to share its tail, one engine "
        "each (e.g. 0,4,8; default: 8, the engine's)",
    )
    p.add_argument(
        "--prefill-lens", default="", help="e.g. 1024,4096: prefill latency by prompt length"
    )
    p.add_argument(
        "--speculative-loops",
        default="0",
        help="self-speculation's draft loops, one engine each (e.g. 0,1: against the same rows without it, "
        "with the drafts' acceptance; default: 0)",
    )
    p.add_argument(
        "--speculative-tokens",
        type=int,
        help="most draft tokens a round checks (default: the engine's)",
    )
    p.add_argument(
        "--speculative-max-streams",
        type=int,
        help="speculation only while at most this many requests decode (default: the engine's)",
    )
    p.add_argument(
        "--floors", action="store_true", help="CUDA: measure ceilings and floors in the same run"
    )


def _serve(p) -> None:
    _common(p)
    _record(p)
    p.add_argument(
        "--base-url", help="an OpenAI-compatible server's /v1 URL (default: rlt.Engine in process)"
    )
    p.add_argument(
        "--served-model-name", help="HTTP: the model name to send (default: the server's first)"
    )
    p.add_argument("--api-key", help="HTTP: sent as `Authorization: Bearer KEY`")
    p.add_argument(
        "--vocab-size", type=int, help="HTTP: prompt token ids lie below it (default: --model's)"
    )
    p.add_argument(
        "--topology", default="single", help="in process: single, Nx or XpYd (default: single)"
    )
    p.add_argument(
        "--rates", default="0.25,0.5,1", help="Poisson arrival rates, req/s (default: 0.25,0.5,1)"
    )
    p.add_argument(
        "--duration", type=float, default=60.0, help="seconds of arrivals per rate (default: 60)"
    )
    p.add_argument(
        "--sweep-rates",
        default="",
        help="e.g. 2,4,8: after --rates, these in order until one is past capacity",
    )
    p.add_argument(
        "--sweep-duration",
        type=float,
        help="seconds of arrivals per sweep rate (default: --duration)",
    )
    p.add_argument("--max-concurrency", default="", help="e.g. 1,64: closed loops after the rates")
    p.add_argument(
        "--num-prompts",
        type=int,
        help="requests per closed loop (default: 4 per slot, at least 16)",
    )
    p.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="closed loops: their clients start evenly over this many seconds (default: 0)",
    )
    p.add_argument(
        "--prompt-lens", default="128,4096", help="prompts cycle through these (default: 128,4096)"
    )
    p.add_argument(
        "--output-len", type=int, default=64, help="tokens per request, EOS ignored (default: 64)"
    )
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="tokens every prompt starts with (default: 0)",
    )
    p.add_argument("--seed", type=int, default=0, help="default: 0")
    g = p.add_argument_group("engine options (in process; default: the engine's)")
    g.add_argument("--no-prefix-caching", action="store_true", help="enable_prefix_caching=False")
    for flag in (
        "--prefill-chunk",
        "--max-num-batched-tokens",
        "--decode-pass-rows",
        "--max-num-seqs",
    ):
        g.add_argument(flag, type=int)
    g.add_argument(
        "--max-local-prefill-length",
        type=int,
        help="PD: prompts up to this prefill on the decode worker",
    )
    g.add_argument(
        "--max-prefill-queue-size", type=int, help="PD: past this queue the decode worker prefills"
    )
    g.add_argument(
        "--prefill-worker-chunk", type=int, help="PD: prompt rows per chunk on prefill workers"
    )
    from rlt.bench import vllm_flags

    vllm_flags.add_flags(p)


def _prefix(p) -> None:
    _common(p)
    p.add_argument(
        "--prefix-len", type=int, default=4096, help="the first turn's prompt (default: 4096)"
    )
    p.add_argument(
        "--new-len", type=int, default=128, help="new tokens of the second turn (default: 128)"
    )
    p.add_argument(
        "--first-output", type=int, default=64, help="the first turn's output tokens (default: 64)"
    )
    p.add_argument(
        "--repeat", type=int, default=8, help="repetitions, each a fresh first turn (default: 8)"
    )


def _first_use(p) -> None:
    _common(p)
    p.add_argument("--topology", default="single", help="single, Nx or XpYd (default: single)")
    p.add_argument("--kv-gib", type=float, help="KV pool per worker in GiB (default: the engine's)")


def _profile(p) -> None:
    _common(p, device="cuda")
    p.add_argument("--dtype", help="default: the engine's (bf16 on CUDA)")
    p.add_argument("--concurrency", type=int, default=1, help="requests at once (default: 1)")
    p.add_argument("--prompt-len", type=int, default=1024, help="default: 1024")
    p.add_argument("--steps", type=int, default=200, help="loop steps per window (default: 200)")
    p.add_argument("--top", type=int, default=30, help="functions and kernels shown (default: 30)")
    p.add_argument("--threshold", default="1.0", help="as offline's: 0.5, latent-diff:0.5, depth:8")
    p.add_argument("--exit-wait-passes", type=int, default=0, help="Huginn's criteria (default: 0)")
    p.add_argument("--kv-gib", type=float, default=20, help="KV pool in GiB (default: 20)")
    p.add_argument("--kernels", choices=("triton", "reference"), default="triton")
    p.add_argument("--steady-decode", choices=("adaptive", "always", "never"), default="adaptive")
    p.add_argument(
        "--speculative-loops",
        type=int,
        default=0,
        help="self-speculation's draft loops (default: 0)",
    )
    p.add_argument(
        "--speculative-tokens", type=int, help="most drafts a round checks (default: the engine's)"
    )
    p.add_argument("--gpu", action="store_true", help="also the GPU's side of the steps (CUDA)")
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="instead: N prompts of --prompt-len, by part against the dense floor (CUDA)",
    )
    p.add_argument("--json-out", help="write the results as JSON here")


def _grammar(p) -> None:
    _common(p)
    p.add_argument("--streams", type=int, default=64, help="concurrent streams (default: 64)")
    p.add_argument("--prompt-len", type=int, default=256, help="default: 256")
    p.add_argument("--max-tokens", type=int, default=256, help="per stream (default: 256)")
    p.add_argument("--neighbours", type=int, default=32, help="free streams (default: 32)")
    p.add_argument("--arrival-ms", type=float, default=50.0, help="ms between (default: 50)")
    p.add_argument("--ttft-reps", type=int, default=20, help="default: 20")
    p.add_argument("--repeat", type=int, default=2, help="rounds of each (default: 2)")
    p.add_argument("--json-out", help="write the results as JSON here")


def _parity(p) -> None:
    _common(p, device="cuda")
    p.add_argument("--dtype", default="bfloat16", help="default: bfloat16")
    p.add_argument("--topology", default="1p1d", help="compared with single (default: 1p1d)")
    lengths = "128,512,1024,2048,4096,300,777,4096"
    p.add_argument("--lengths", default=lengths, help=f"prompt lengths (default: {lengths})")
    p.add_argument("--max-tokens", type=int, default=16, help="default: 16")
    p.add_argument("--prefill-chunk", type=int, default=512, help="default: 512")
    p.add_argument("--kv-gib", type=float, default=24, help="KV GiB per worker (default: 24)")
    p.add_argument("--batch-invariant", action="store_true", help="batch-invariant GEMMs, RMSNorm")
    p.add_argument("--json-out", help="write the report as JSON here")


def _kv_handoff(p) -> None:
    import dataclasses

    from rlt.bench.kv_handoff import Handoff  # (no torch at import)

    for f in dataclasses.fields(Handoff):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--json-out", help="write the results as JSON here")


def _gemm(p) -> None:
    from rlt.bench.gemm import add_arguments  # (no torch at import)

    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    import importlib

    module, function = RUNS[args.bench_command]
    return getattr(importlib.import_module(f"rlt.bench.{module}"), function)(args) or 0
