"""What the front ends share, below all of them: the `rlt` command (rlt/cli.py), `rlt serve`
(rlt/serve) and the Dynamo backend (rlt/dynamo) each import these, and none imports another front
end.

Modules:
  flags.py    the engine's options as command-line flags, one per EngineConfig / LaunchConfig field
              (`rlt generate`, `rlt serve`, `python -m rlt.dynamo`)
  parsers.py  a chat choice's text -> reasoning_content, content, tool_calls (<think>, Hermes
              <tool_call>), incremental: a stream's deltas add up to the whole response
  forced.py   tool calls a grammar forced (tool_choice required or named), as parsers' events
  metrics.py  /metrics (prometheus_client): the `rlt:` metrics, per-stream latencies, engine state
              at scrape, model_name on each, queue / prefill / decode from the engine's times
"""
