"""`vllm bench serve`'s flags for random datasets on `rlt bench serve`, and vLLM's summary of a run,
so a vLLM user's command runs here as it reads: `--dataset-name random --random-input-len 1024
--random-output-len 128 --num-prompts 200 --request-rate 4` sends 200 requests at Poisson 4 req/s;
with `--request-rate inf` (vLLM's default) they all go at once, or `--max-concurrency C` at a time.
Any of these flags runs that one load instead of rlt's own --rates; rlt's flags still apply."""

import math

SENT = "============ Serving Benchmark Result ============"
# the flags that, given, make the run vLLM's one load
FLAGS = (
    "dataset_name",
    "random_input_len",
    "random_output_len",
    "random_prefix_len",
    "request_rate",
)


def add_flags(p) -> None:
    title = "vLLM's `vllm bench serve` flags (random prompts; any of them: that one load)"
    add = p.add_argument_group(title).add_argument
    add("--dataset-name", choices=("random",), help="the prompts: random token ids")
    add("--random-input-len", type=int, help="prompt tokens (rlt: --prompt-lens)")
    add("--random-output-len", type=int, help="tokens per request (rlt: --output-len)")
    prefix = "tokens every prompt starts with (rlt: --shared-prefix-len)"
    add("--random-prefix-len", type=int, help=prefix)
    add("--random-range-ratio", type=float, default=0.0, help="only 0: prompts of one length")
    rate = "Poisson req/s for --num-prompts requests; inf: all at once"
    add("--request-rate", type=float, help=rate)
    add("--ignore-eos", action="store_true", help="(rlt's requests always ignore EOS)")
    add("--backend", choices=("vllm", "openai"), help="(rlt's client: OpenAI's completions)")
    add("--endpoint", choices=("/v1/completions",), help="(rlt's client's)")


def apply(args) -> bool:
    """vLLM's flags as rlt's (args changed in place); -> whether they were given (vLLM's one
    load)."""
    if all(getattr(args, n) is None for n in FLAGS):
        return False
    if args.random_range_ratio != 0.0:
        raise SystemExit("--random-range-ratio: only 0 (prompts of one length) is supported")
    if args.random_input_len is not None:
        args.prompt_lens = str(args.random_input_len)
    if args.random_output_len is not None:
        args.output_len = args.random_output_len
    if args.random_prefix_len is not None:
        args.shared_prefix_len = args.random_prefix_len
    args.num_prompts = args.num_prompts or 1000  # (vLLM's default)
    rate = math.inf if args.request_rate is None else args.request_rate
    if math.isinf(rate):  # all at once, or --max-concurrency at a time
        args.rates, args.max_concurrency = "", args.max_concurrency or str(args.num_prompts)
    elif args.max_concurrency:
        why = "--max-concurrency with a finite --request-rate is not supported: give one of them"
        raise SystemExit(why)
    else:
        args.rates, args.count = str(rate), args.num_prompts
    args.sweep_rates = ""
    return True


def summary(row: dict) -> str:
    """vLLM's result block for one row (its labels, so its parsers and eyes read it)."""

    def line(label, value, fmt="{:.2f}"):
        return f"{label:<40}{fmt.format(value) if value is not None else 'n/a'}"

    total = row.get("total_input_tokens", 0) + row.get("total_output_tokens", 0)
    lines = [SENT, line("Successful requests:", row.get("completed", 0), "{}")]
    if "concurrency" in row:
        lines.append(line("Maximum request concurrency:", row["concurrency"], "{}"))
    else:
        lines.append(line("Request rate configured (RPS):", row["rate"]))
    dur = row.get("duration_s") or 0
    lines += [
        line("Benchmark duration (s):", dur),
        line("Total input tokens:", row.get("total_input_tokens"), "{}"),
        line("Total generated tokens:", row.get("total_output_tokens"), "{}"),
        line("Request throughput (req/s):", row.get("request_throughput_req_s")),
        line("Output token throughput (tok/s):", row.get("output_throughput_tok_s")),
        line("Total Token throughput (tok/s):", total / dur if dur else None),
    ]
    for key, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
    ):
        lines.append(f"{title:-^50}")
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            lines.append(line(f"{label} {key.upper()} (ms):", row.get(f"{stat}_{key}_ms")))
    return "\n".join(lines + ["=" * 50])
