"""What the front ends share, below all of them: the `rlt` command (rlt/cli.py), `rlt serve`
(rlt/serve) and the Dynamo backend (rlt/dynamo) each import these, and none imports another front
end. flags.py: the engine's options as command-line flags; parsers.py and forced.py: a chat
response's reasoning and tool calls; metrics.py: the `rlt:` Prometheus metrics."""
