"""What several test modules share: quick liveness settings for the engines they launch (in Python,
with PD's transfer deadline, and on a command line), a small KV pool whose prompts span several
chunks and blocks, Huginn's depth override, and waiting for a condition or until an engine holds
no request's blocks."""

import asyncio
import time

FAST = dict(heartbeat_interval=0.2, heartbeat_timeout=3.0, startup_timeout=60.0)
FAST_PD = FAST | dict(transfer_timeout=10.0)
FAST_ARGS = ["--heartbeat-interval", "0.2", "--heartbeat-timeout", "3.0", "--startup-timeout", "60"]
SMALL = dict(block_size=4, prefill_chunk=5, num_blocks=400)
HUGINN = {"mean_recurrence": 6}  # like-init state, a few steps: keeps CPU tests fast
OV = {"huginn": HUGINN}


async def all_blocks_free(engine, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = engine.stats()
        if st.live_requests == 0 and all(
            w.kv_blocks_free == w.kv_blocks_total and w.running == 0 and w.waiting == 0
            for w in st.workers
        ):
            return True
        await asyncio.sleep(0.05)
    raise AssertionError(f"blocks not all free: {engine.stats()}")


async def all_free(engine, timeout=10.0):
    await all_blocks_free(engine, timeout)
    st = engine.stats()
    assert st.pending_cleanup == 0
    assert all(w.credit_blocks == 0 and w.credit_slots == 0 for w in st.workers), st


async def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
