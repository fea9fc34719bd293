"""What the coordinator (rlt/control) and the workers (rlt/workers) agree on, so that neither
imports the other.

Modules:
  config.py           EngineConfig (per worker: KV layout and size, batching, kernels, CUDA graphs,
                      steady decode, speculation); LaunchConfig (topology, device, dtype, timeouts,
                      restart, PD routing, faults). Typed msgspec Structs (fields.py):
                      Engine.launch(**options), the handshake and the CLI flags all come from them.
  sampling_params.py  SamplingParams (what a request asks), ResolvedParams (every default filled in)
  validation.py       prompt and SamplingParams against the ModelConfig -> ResolvedParams (both
                      sides)
  grammar.py          structured output's specs: the coordinator's structure check, the workers'
                      compile
  protocol.py         the two message unions: ToWorker and FromWorker (docs/architecture.md lists
                      the messages)
  prefix_keys.py      prefix-cache block keys (tokens and depths), for the router and the workers

Structured output (grammar.py; xgrammar, chosen over llguidance by measurement in issue #32):
SamplingParams.structured_output (StructuredOutput: json, regex, choice, grammar, json_object or
structural_tag) becomes a spec (kind, text) in ResolvedParams; the coordinator checks its size
limits (max_grammar_*, max_regex_length) and its structure at the call (xgrammar's Grammar, no
tokenizer; cached); a bad one is a RequestError naming the field. JSON grammars are tightened where
xgrammar 0.2.9 is lax (its length-bounded strings admit raw control characters: their class is
rewritten in the grammar's printed EBNF), so every JSON output parses with strict json.loads. The
workers' side: rlt/workers/__init__.py.
"""
