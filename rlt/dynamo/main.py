"""`python -m rlt.dynamo`: runs the node its options ask for (rlt/dynamo/args.py) until SIGINT or
SIGTERM, then drains it and stops its rlt worker; a bad option is one line on stderr and exit
status 2."""

import asyncio
import logging
import os
import signal
import sys

DRAIN_TIMEOUT_S = 60.0  # how long a stopping prefill node waits for the prefills it holds


def main(argv=None) -> int:
    from dynamo.common.backend.run import run

    from rlt.dynamo.args import parse
    from rlt.dynamo.engine import RltEngine

    try:
        node = parse(argv)
    except ValueError as e:  # ConfigError / RequestError included: one line, as `rlt serve`
        print(f"python -m rlt.dynamo: {e}", file=sys.stderr)
        return 2
    if node.role != "prefill":
        built = (RltEngine.of(node), node.config)

        async def factory(_argv):
            return built

        # Dynamo's worker shuts down gracefully on SIGINT and SIGTERM (drain, then cleanup);
        # Python's
        # own SIGINT handler would also raise KeyboardInterrupt into the loop and skip that.
        signal.signal(signal.SIGINT, lambda *_: None)
        run(RltEngine, argv, engine_factory=factory)
    else:
        import uvloop

        uvloop.run(serve_prefill(node.launch, node.args))
    _exit_drained()


def _exit_drained() -> None:
    """Exit 0 without Python's finalization: the node has drained, cleaned up and stopped its
    worker, but threads of Dynamo's runtime are still alive, and finalization unwinding them now and
    then aborts the process ("FATAL: exception not rethrown", exit -6) after a clean stop."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def serve_prefill(launch, args) -> None:
    """A prefill node: its worker READY, then NAMESPACE.prefill.generate served until SIGINT or
    SIGTERM; then the endpoint leaves discovery, the prefills it holds finish (their KV written,
    their streams ended) and the worker stops."""
    from dynamo.runtime import DistributedRuntime

    from rlt.dynamo.prefill import PrefillNode

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    node = PrefillNode(launch)
    await node.start()
    print(f"rlt prefill node: worker logs in {node.supervisor.log_dir}", flush=True)
    runtime = DistributedRuntime(loop, args.discovery_backend, args.request_plane)
    endpoint = runtime.endpoint(f"{args.namespace}.prefill.generate")
    serving = asyncio.ensure_future(endpoint.serve_endpoint(node.handle))
    print(f"rlt prefill node ready at {args.namespace}.prefill.generate", flush=True)
    try:
        await asyncio.wait(
            [serving, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        # drain: out of discovery (decode nodes send no more), then what it holds finishes
        if stop.is_set():
            await endpoint.unregister_endpoint_instance()
            print(
                f"rlt prefill node: out of discovery, draining {len(node.relay.queues)} prefills",
                flush=True,
            )
            held = await node.drain(DRAIN_TIMEOUT_S)
            print(
                f"rlt prefill node: left discovery, {held} prefills still held after the drain",
                flush=True,
            )
    finally:
        runtime.shutdown()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await node.shutdown()
        print(
            f"rlt prefill node: {node.prefilled} prompts prefilled, {node.kv_bytes} KV bytes written",
            flush=True,
        )
