"""Benchmark measurement and `rlt bench` (cli.py; as `vllm bench`). docs/performance.md gives the
command of each table it holds.

Modules:
  cli.py              the parsers: offline, serve, prefix, first-use, profile, grammar, parity,
                      kv-handoff, gemm; each run imported only when it runs
  commands.py         `rlt bench offline` and `rlt bench serve`
  offline.py          an in-process LoopEngine, every request at once: decode tok/s, exit depths
  floors.py           in-run ceilings and floors (GEMM, read bandwidth; read_triton.py's kernel)
  serving.py          Poisson arrivals into rlt.Engine or any OpenAI-compatible server
                      (http_client.py), vLLM's metric names; vllm_flags.py: `vllm bench serve` flags
  phases.py           `rlt bench prefix` and `rlt bench first-use`
  profile.py          where a decode step's time goes, from a torch.profiler trace
  step_parts.py       a pass by part (products, attention, the rest) against its bytes or its floor
  grammar.py          what structured output costs
  parity.py           a PD topology against `single`, token for token
  kv_handoff.py       KV handoff bandwidth through rlt's own KVTransport
  gemm.py             few-row decode products: cuBLAS, the GEMV and the skinny GEMM's configs
"""
