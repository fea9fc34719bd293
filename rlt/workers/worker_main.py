"""Worker process: HELLO -> Handshake -> load weights, build the engine -> READY -> the loop of
rlt/workers/worker.py (drain control messages -> one engine step -> one Outputs message). A
heartbeat thread (its own socket) tells the coordinator the process is alive even during a long
step; a frozen process (SIGSTOP) goes silent and is caught by the coordinator's deadline. The
worker dies with its parent: PR_SET_PDEATHSIG is set before anything heavy is imported, and a
parent that died before that is seen as a changed parent pid (checked then, and by the heartbeat).
"""

import argparse
import gc
import hashlib
import json
import os
import socket
import sys
import threading
import time
import traceback

import zmq

from rlt import envs
from rlt.contract import protocol as pr
from rlt.workers.lifetime import die_with_parent


def _heartbeat(ctx, addr: str, identity: bytes, interval: float, parent: int, stop, counters):
    """Beat every `interval` s until `stop` (a threading.Event) is set, with the progress, busy
    and trouble of `counters` (the worker's WorkerCounters)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    while not stop.wait(interval):
        if os.getppid() != parent:
            os._exit(1)
        beat = pr.Heartbeat(os.getpid(), counters.progress, counters.busy, counters.trouble())
        sock.send(pr.encoder.encode(beat))
    sock.close()


def fingerprint(mc, weights: dict, dtype: str, engine_cfg) -> str:
    """Hash of config + weights + dtype + KV layout: identical workers hash identically."""
    import torch

    h = hashlib.sha256(json.dumps(mc.raw, sort_keys=True).encode())
    h.update(f"{dtype}|{engine_cfg.kv_layout}|{engine_cfg.block_size}".encode())
    for name in sorted(weights):
        t = weights[name].double()
        h.update(f"{name}{tuple(t.shape)}{float(t.sum()):.9e}{float((t * t).sum()):.9e}".encode())
        del t
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return h.hexdigest()[:16]


def build(h: pr.Handshake, counters):
    """-> (the engine, counting into `counters`, and the fingerprint)."""
    import torch

    from rlt.contract.config import parse_topology
    from rlt.models.family import FAMILIES
    from rlt.models.loader import load_weights, resolve_dtype
    from rlt.models.model_config import ModelConfig
    from rlt.workers.engine import LoopEngine

    mc = ModelConfig.from_dict(h.config, h.model_path)
    if h.device.startswith("cuda"):
        torch.cuda.set_device(h.device)  # NIXL/UCX register VRAM in the current device's context
        if h.engine.kernels == "triton":
            from rlt.workers.counters import count_triton_compiles

            count_triton_compiles(counters)
    # CPU workers share the cores and leave one to the coordinator: a stream's tokens pass through
    else:
        # it (two threads in a lone worker on two cores: the same tok/s, inter-token gaps up to 10x
        # longer)
        cores = len(os.sched_getaffinity(0)) - 1
        torch.set_num_threads(max(1, cores // len(parse_topology(h.launch.topology))))
    dtype = resolve_dtype(h.launch.dtype, h.device, mc)
    weights = load_weights(mc, dtype, h.device)
    fp = fingerprint(mc, weights, str(dtype), h.engine)
    model = FAMILIES[mc.model_type].model_cls(mc, weights)
    return LoopEngine(mc, model, h.engine, dtype, h.device, counters), fp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--handshake-timeout", type=float, default=60.0)
    ap.add_argument("--parent-pid", type=int, required=True)
    args = ap.parse_args(argv)
    die_with_parent()
    parent = args.parent_pid
    if os.getppid() != parent:  # the coordinator died before the death signal was set
        return 1
    from rlt.workers.counters import WorkerCounters
    from rlt.workers.worker import Worker  # torch: only once the worker dies with its parent

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    sock.setsockopt(zmq.LINGER, 2000)  # so a final Fatal is flushed
    sock.connect(args.addr)
    stop = threading.Event()
    counters = WorkerCounters()  # the engine moves them, the loop and the heartbeat read them
    try:
        sock.send(pr.encoder.encode(pr.Hello(os.getpid())))
        if not sock.poll(int(args.handshake_timeout * 1000)):
            raise TimeoutError(
                f"no handshake from the coordinator within {args.handshake_timeout} s"
            )
        h = pr.to_worker.decode(sock.recv())
        if not isinstance(h, pr.Handshake):
            raise RuntimeError(f"expected a handshake, got {type(h).__name__}")
        threading.Thread(
            target=_heartbeat,
            daemon=True,
            args=(
                ctx,
                args.addr,
                args.identity.encode() + b"/hb",
                h.launch.heartbeat_interval,
                parent,
                stop,
                counters,
            ),
        ).start()
        t0 = time.monotonic()
        engine, fp = build(h, counters)
        p = engine.pool
        say = lambda line: print(f"{args.identity} {line}", flush=True)  # noqa: E731 - the worker's log
        say(f"KV pool: {p.num_blocks} blocks ({engine.pool_sizing})")
        from rlt.workers.memory import grammar
        from rlt.workers.warmup import warm_up

        # its compile processes start beside the
        if grammar(engine.mc) and engine.backend.needs_warm_up:
            # warm-up (a CPU worker, which builds nothing, at its first grammar)
            engine.grammars.start().grow()
        say(warm_up(engine, decodes=h.role != "prefill", log=say))
        if engine.grammars.pool is not None:
            engine.grammars.pool.wait_ready()
        counters.trouble = engine.grammars.stuck
        transport = None
        if h.role in ("prefill", "decode"):
            from rlt.workers.kv_transfer import KVTransport

            # unique across hosts and coordinators (a Dynamo prefill node serves many decode nodes)
            transport = KVTransport(
                f"{args.identity}@{socket.gethostname()}:{os.getpid()}", p.cache
            )
            say(
                f"KV transport: NIXL agent {transport.name} over UCX, {envs.ucx_settings()}; UCX_PROTO_INFO=y logs the "
                "transports UCX picks for each peer (RDMA: rc_/dc_/ud_ ..., or tcp)"
            )
        if h.cache_events and p.prefix is not None:  # (after warm-up, which leaves the cache empty)
            p.prefix.watch()
        worker = Worker(sock, engine, h.role, transport, h.launch.transfer_timeout)
        # The heap frozen (as vLLM's engine does; this process keeps its one engine to the end): a
        # full garbage collection in service then scans only objects made since, instead of
        # stalling every stream for the whole heap (~100 ms with torch and the CUDA graphs loaded).
        gc.collect()
        gc.freeze()
        if h.launch.faults is not None:  # tests only: the one place faults are read
            from rlt.workers.faults import inject

            worker, fp = inject(h.launch.faults, worker, fp)
        print(
            f"{args.identity} (pid {os.getpid()}) ready in {time.monotonic() - t0:.1f} s: {h.model_path} on "
            f"{h.device}, {p.cache.dtype}, {p.num_blocks} KV blocks of {p.block_size} positions, fingerprint {fp}, "
            f"heap frozen ({gc.get_freeze_count()} objects)",
            flush=True,
        )
        sock.send(
            pr.encoder.encode(
                pr.Ready(
                    kv_blocks_total=p.num_blocks,
                    block_size=p.block_size,
                    kv_planes=p.num_core_planes + int(p.has_boundary),
                    fingerprint=fp,
                    transport=transport.info() if transport else None,
                )
            )
        )
        worker.run()
        if transport is not None:
            transport.close()
        return 0
    except BaseException as e:  # noqa: BLE001 - report the worker's own error, then die
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        sys.stderr.write(traceback.format_exc())
        try:
            sock.send(pr.encoder.encode(pr.Fatal(text)))
        except zmq.ZMQError:
            pass
        return 1
    finally:
        stop.set()
        sock.close()
        ctx.term()


if __name__ == "__main__":
    rc = main()
    # Everything the worker owns is closed by now (sockets, NIXL agent); its log only needs a flush.
    # Skipping the interpreter's teardown of torch's modules saves ~0.4 s of CPU per stop or
    # restart.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
