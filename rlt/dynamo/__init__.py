"""rlt workers as an NVIDIA Dynamo backend (`python -m rlt.dynamo`; the `rlt[dynamo]` extra).

A node runs one rlt.Engine (the `single` topology: its coordinator in the Dynamo worker process,
its worker as a subprocess) behind Dynamo's unified Python backend (dynamo.common.backend):
Dynamo's worker owns discovery registration, the request plane (TCP), signals, draining and
cancellation; RltEngine (engine.py) owns the mapping. docs/deploy.md says how to run it.

Modules:
  main.py          the command: WorkerConfig, Dynamo's worker run
  args.py          the node's options, checked, into a Node
  engine.py        RltEngine: PreprocessedRequest -> SamplingParams, token-id deltas back
  router_state.py  KV events, load snapshots, health canary, rlt: metrics for Dynamo's router
  prefill.py       a prefill node (an EventSink relay); remote.py: the decode node's
                   PrefillConnector
  wire.py          the prefill calls and replies between nodes (msgspec tagged unions)

What Dynamo's runtime does differently from rlt's own coordinator:

* The frontend tokenizes, detokenizes and checks stop strings (tokens in): the engine gets
  Dynamo's PreprocessedRequest and returns token ids; rlt's detokenizer and stop-string handling
  are not on this path. Sampling options and stop conditions still pass through rlt's one
  validation (SamplingParams, then Engine.generate's checks): a bad field is a 400 naming it.
* Routing between workers is Dynamo's (round robin over discovered instances, or its KV-aware
  router fed by router_state.py's KV events). Inside a worker, rlt's scheduler, lifecycle, sampler
  and KV layout are the same code as everywhere else.
* Request fields: the frontend rejects body fields it does not know, so rlt's loop options travel
  in nvext.annotations ("exit_threshold=0.5"), and exit depths go back in each chunk's engine_data
  (exit_depths; the last chunk also request_exit_depths, since a whole response keeps only the last
  chunk's), which a client asks for with nvext.extra_fields.
* Prefill/decode across nodes keeps rlt's direction. Dynamo's own disaggregation runs prefill first
  and hands the decode worker what the prefill worker holds (the decode side reads). rlt's decode
  node, the one the frontend routes to, reserves its blocks, and a prefill node found through
  Dynamo writes every depth plane into them over NIXL and gives the first token: the decode node
  runs rlt's own PD lifecycle (rlt/control/lifecycle.py, unchanged) with its prefill slot a proxy
  (remote.py) that sends the lifecycle's messages to a prefill node's endpoint
  (NAMESPACE.prefill.generate, round robin; a cancel goes to the instance that took the request)
  and hands what comes back to the Supervisor as that worker's own messages. A prefill node
  (prefill.py) runs its worker under a Supervisor with a Relay in place of the Lifecycle,
  introduces each decode agent to its worker on first use, numbers requests itself and names the
  decode side's generation in every KV notification (Prefill.dst_gen). NIXL agent names carry host
  and pid: many decode nodes share a prefill node.
* Failure across nodes. A prefill node that dies fails what it holds (its stream breaks); a request
  already handed to the decode node finishes. A broken stream cannot tell a dead writer from a
  cut-off one, which may still write until its own transfer deadline: the request fails at once,
  and its decode blocks are freed transfer_timeout later (Lifecycle.on_writer_lost, then a Drained
  from the proxy). The frontend answers 503 without the reason (it hides 5xx texts): the decode
  node logs it.
"""
