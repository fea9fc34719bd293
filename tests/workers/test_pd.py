"""Prefill/decode disaggregation: real worker processes, real NIXL (UCX, DRAM to DRAM)."""

import asyncio
import copy
import os
import re
import signal
import time

import pytest

import rlt
from rlt import EngineDeadError, SamplingParams
from rlt.contract.config import Faults
from rlt.control.lifecycle import Phase
from tests.helpers import FAST_PD, SMALL, all_free, wait_for
from tests.processes import as_from_a_terminal, rlt_processes_of, wait_for_ready_workers
from tests.workers.helpers import requests, run_all

_SINGLE: dict = {}


async def single_reference(path, layout, family, reqs):
    """run_all's outputs in the single topology (default options), run once per session for the
    same requests: the reference several tests compare their topologies' outputs with."""
    key = (path, layout, family, repr(reqs))
    if key not in _SINGLE:
        _SINGLE[key] = await run_all(path, "single", layout, family, reqs)
    return copy.deepcopy(_SINGLE[key])


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
async def test_pd_equals_single(checkpoints, family, layout):
    reqs = requests(family)
    single = await single_reference(checkpoints[family], layout, family, reqs)
    # float32 GEMMs over different batches (see test_engine)
    tol = 1e-3 if family == "huginn" else 1e-4
    # (routing is the same for every family)
    for topology in ("1p1d", "2p2d") if family == "ouro" else ("1p1d",):
        got = await run_all(checkpoints[family], topology, layout, family, reqs)
        for (t1, d1, lp1, f1), (t2, d2, lp2, f2) in zip(single, got):
            assert (t1, d1, f1) == (t2, d2, f2), topology
            if lp1 is not None:
                for a, b in zip(lp1, lp2):
                    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < tol
    if family == "ouro":
        assert len(set(single[2][1][1:] + single[3][1][1:])) >= 2  # adaptive exits really happened


@pytest.mark.parametrize(
    "opts,local",
    [
        (dict(max_local_prefill_length=12), 2),  # the 11- and 12-token prompts
        (dict(max_prefill_queue_size=1), 3),  # all but the first: P holds it
        (dict(max_prefill_queue_size=0), 4),
        (dict(prefill_worker_chunk=64), 0),
    ],
)  # whole prompts per chunk on P
async def test_conditional_disaggregation_equals_single(checkpoints, opts, local):
    """Prompts the decode worker prefills itself (short, or while the prefill worker has a queue),
    or the prefill worker takes whole (prefill_worker_chunk), give the same tokens, depths and
    logprobs as single, and every block and credit comes back."""
    reqs = requests("ouro")
    single = await single_reference(checkpoints["ouro"], "last_exited", "ouro", reqs)
    stats = []
    got = await run_all(checkpoints["ouro"], "1p1d", "last_exited", "ouro", reqs, stats, **opts)
    assert stats[0].local_prefills == local
    if "prefill_worker_chunk" in opts:  # each prompt in one chunk on P, not ceil(len / 5)
        assert stats[0].kv_chunks == len(reqs)
    elif "max_local_prefill_length" in opts:  # the 17- and 23-token prompts, in chunks of 5
        assert stats[0].kv_chunks == 4 + 5
    for (t1, d1, lp1, f1), (t2, d2, lp2, f2) in zip(single, got):
        assert (t1, d1, f1) == (t2, d2, f2)
        assert (lp1 is None) == (lp2 is None)
        for a, b in zip(lp1 or (), lp2 or ()):
            assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-4


@pytest.mark.parametrize("layout", ["last_exited", "shared"])
async def test_pd_decode_worker_preempts_and_resumes_exactly(checkpoints, layout):
    """A decode worker whose pool cannot hold every request as it grows preempts the newest and
    resumes it by recompute (prompt included, on the decode worker): the same tokens, depths and
    logprobs as single with a large pool, and every block and credit comes back."""
    reqs = requests("ouro") * 2
    single = await run_all(checkpoints["ouro"], "single", layout, "ouro", reqs)
    stats = []
    planes = 4 if layout == "last_exited" else 1
    got = await run_all(
        checkpoints["ouro"], "1p1d", layout, "ouro", reqs, stats, num_blocks=planes * 10
    )
    decode = next(w for w in stats[0].workers if w.role == "decode")
    assert decode.preemptions > 0 and decode.kv_blocks_free == decode.kv_blocks_total
    for (t1, d1, lp1, f1), (t2, d2, lp2, f2) in zip(single, got):
        assert (t1, d1, f1) == (t2, d2, f2)
        for a, b in zip(lp1 or (), lp2 or ()):
            assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-4


def launch_pd(checkpoints, topology="1p1d", **kw):
    """`async with launch_pd(...) as engine` (or awaited)."""
    return rlt.Engine.launch(checkpoints["ouro"], topology=topology, **(SMALL | FAST_PD | kw))


def workers(engine, role):
    return [w for w in engine._supervisor.workers if w is not None and w.role == role]


async def expect_reuse_ok(engine, rid, prompt=(1, 2, 3)):
    outs = [
        o
        async for o in engine.generate(
            list(prompt),
            SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
            request_id=rid,
        )
    ]
    assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 4


async def freed_then_reusable(engine, rid, prompt=(1, 2, 3)):
    """Every block and credit is back on both workers, and the id serves again at once."""
    await all_free(engine)
    await expect_reuse_ok(engine, rid, prompt)
    await all_free(engine)


async def test_cancel_while_waiting_for_decode_blocks(checkpoints):
    async with launch_pd(checkpoints) as engine:
        # the hog holds 4 planes x 51 of the decode worker's 400 blocks at first, and grows; a
        # 300-token prompt needs 4 x 76 more
        big = SamplingParams(max_tokens=199, temperature=0, ignore_eos=True)
        hog = engine.generate([1, 2] * 100, big, request_id="hog")
        first = await hog.__anext__()
        assert first.token_ids
        stream = engine.generate(
            [5, 6, 7] * 100, SamplingParams(max_tokens=40, ignore_eos=True), request_id="w"
        )
        await asyncio.sleep(0.2)
        # the decode worker has no blocks for it yet
        assert engine.request_phase("w") == Phase.WAITING
        assert await engine.abort("w")
        assert (await stream.__anext__()).finish_reason == "abort"
        await hog.aclose()
        await expect_reuse_ok(engine, "w")
        await all_free(engine)


async def test_cancel_while_reserved(checkpoints):
    async with launch_pd(checkpoints) as engine:
        p = workers(engine, "prefill")[0]
        gate = asyncio.Event()
        real_send = engine._supervisor._send

        async def gated_send(w, msg):  # hold every message to the prefill worker, in order
            if w is p:
                await gate.wait()
            return await real_send(w, msg)

        engine._supervisor._send = gated_send
        stream = engine.generate(list(range(3, 30)), SamplingParams(max_tokens=20), request_id="r")

        def reserved():
            """D's Reserved sets the phase; its stats with the blocks held come in the Outputs it sends
            next. Both, or all_free below could pass on D's stats from before the reservation."""
            (d,) = [w for w in engine.stats().workers if w.role == "decode"]
            return (
                engine.request_phase("r") == Phase.RESERVED and d.kv_blocks_free < d.kv_blocks_total
            )

        await wait_for(reserved)
        assert await engine.abort("r")  # Cancel queues behind Prefill: P prefills nothing for long
        gate.set()
        assert (await stream.__anext__()).finish_reason == "abort"
        await freed_then_reusable(engine, "r")


async def test_cancel_while_prefilling(checkpoints):
    # SHARED prefills position by position: the prompt stays in PREFILLING for many steps
    async with launch_pd(checkpoints, prefill_chunk=1, kv_layout="shared") as engine:
        stream = engine.generate(list(range(3, 200)), SamplingParams(max_tokens=5), request_id="p")
        await wait_for(lambda: engine.request_phase("p") == Phase.PREFILLING)
        assert workers(engine, "prefill")[0].stats.kv_blocks_free < 400  # P is really computing
        assert await engine.abort("p")
        assert (await stream.__anext__()).finish_reason == "abort"
        await freed_then_reusable(engine, "p")


async def test_cancel_while_transferring(checkpoints):
    async with launch_pd(checkpoints) as engine:
        held = []
        real = engine._lifecycle.on_prefill_released

        def hold_transfer_done(p, gen, done):
            if done is not None:
                held.append((p, gen, done))  # the decode worker is not activated yet
            else:
                real(p, gen, done)

        engine._lifecycle.on_prefill_released = hold_transfer_done
        stream = engine.generate(list(range(3, 30)), SamplingParams(max_tokens=20), request_id="t")
        first = await stream.__anext__()
        # streamed by the prefill worker
        assert len(first.token_ids) == 1 and first.exit_depths == [4]
        await wait_for(lambda: held)
        assert engine.request_phase("t") == Phase.TRANSFERRING
        assert await engine.abort("t")
        assert (await stream.__anext__()).finish_reason == "abort"
        engine._lifecycle.on_prefill_released = real
        for args in held:
            real(*args)  # late: a retired generation, ignored
        await freed_then_reusable(engine, "t")


async def test_cancel_with_writes_in_flight_does_not_stall_the_prefill_worker(checkpoints):
    """A cancelled request's KV writes hang: the prefill worker keeps serving others meanwhile, and
    reports it drained (the decode worker then frees its blocks) only once the writes' deadline passed."""
    async with launch_pd(
        checkpoints, transfer_timeout=4.0, faults=Faults(hang_transfer_first_token=97)
    ) as engine:
        stream = engine.generate(
            [97] + list(range(3, 40)), SamplingParams(max_tokens=20), request_id="hung"
        )
        await stream.__anext__()  # its first token streamed; its writes never report done
        await wait_for(lambda: engine.request_phase("hung") == Phase.TRANSFERRING)
        t0 = time.monotonic()
        assert await engine.abort("hung")
        assert (await stream.__anext__()).finish_reason == "abort"
        other = engine.generate(list(range(5, 30)), SamplingParams(max_tokens=3, ignore_eos=True))
        outs = [o async for o in other]
        assert outs[-1].finish_reason == "length"
        # not behind the hung writes: the decode side still holds their destination (until their
        # deadline)
        assert engine.stats().pending_cleanup == 1
        await freed_then_reusable(engine, "hung")
        assert time.monotonic() - t0 >= 4.0


async def test_cancel_while_decoding(checkpoints):
    async with launch_pd(checkpoints) as engine:
        outs = []
        async for out in engine.generate(
            list(range(3, 30)), SamplingParams(max_tokens=300, ignore_eos=True), request_id="d"
        ):
            outs.append(out)
            if len(outs) == 4:
                assert engine.request_phase("d") == Phase.DECODING
                assert await engine.abort("d")
        assert outs[-1].finish_reason == "abort"
        await freed_then_reusable(engine, "d")


@pytest.mark.parametrize("victim", ["prefill", "decode"])
async def test_killed_worker_fails_only_its_requests(checkpoints, victim):
    async with launch_pd(
        checkpoints, topology="2p2d" if victim == "decode" else "1p1d", num_blocks=2000
    ) as engine:
        results = {}

        async def run(rid, prompt, n):
            try:
                async for out in engine.generate(
                    prompt,
                    SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
                    request_id=rid,
                ):
                    results[rid] = out
            except EngineDeadError as e:
                results[rid] = e

        # Two long decodes (spread over both decode workers in 2p2d), then a long prefill.
        tasks = [asyncio.ensure_future(run(f"dec{i}", [3 + i, 4, 5], 400)) for i in range(2)]
        await wait_for(
            lambda: all(engine.request_phase(f"dec{i}") == Phase.DECODING for i in range(2))
        )
        if victim == "prefill":
            tasks.append(asyncio.ensure_future(run("pre", list(range(3, 300)), 5)))
            await wait_for(lambda: engine.request_phase("pre") == Phase.PREFILLING)
            target = workers(engine, "prefill")[0]
        else:
            target = engine._lifecycle.live["dec0"].decode.worker
        os.kill(target.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        if victim == "prefill":
            # how it died, not its last log line (NIXL logs there)
            assert isinstance(results["pre"], EngineDeadError)
            assert re.fullmatch(
                r"prefill worker 0 \(pid \d+\) was killed by SIGKILL", str(results["pre"])
            )
            assert [results[f"dec{i}"].finish_reason for i in range(2)] == ["length", "length"]
        else:
            assert isinstance(results["dec0"], EngineDeadError)
            assert re.fullmatch(
                r"decode worker \d \(pid \d+\) was killed by SIGKILL", str(results["dec0"])
            )
            assert results["dec1"].finish_reason == "length"  # on the other decode worker
        await wait_for(
            lambda: all(w is not None and w.ready for w in engine._supervisor.workers), 60
        )
        await expect_reuse_ok(engine, "dec0")
        await all_free(engine)


async def test_fingerprint_mismatch_stops_launch(checkpoints):
    faults = Faults(fingerprint_role="decode")
    with pytest.raises(
        RuntimeError, match=r"decode worker 0 \(fingerprint \w+\) differs from prefill worker 0"
    ):
        await launch_pd(checkpoints, faults=faults)
    with pytest.raises(
        RuntimeError, match=r"^decode worker 0 \(fingerprint \w+\) differs from prefill worker 0"
    ):
        await launch_pd(checkpoints, topology="2p1d", faults=faults)  # the odd one out is named


def test_cli_topology_1p1d_equals_single(checkpoints):
    import json
    import subprocess
    import sys

    def gen(topology):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlt",
                "generate",
                "--model",
                checkpoints["nanbeige"],
                "--prompt-token-ids",
                ",".join(map(str, range(3, 40))),
                "--prompt",
                "The river runs",
                "--max-tokens",
                "6",
                "--logprobs",
                "3",
                "--json",
                "--topology",
                topology,
                "--prefill-chunk",
                "8",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines()]

    single, pd = gen("single"), gen("1p1d")
    for a, b in zip(single, pd):
        assert (a["token_ids"], a["exit_depths"], a["text"]) == (
            b["token_ids"],
            b["exit_depths"],
            b["text"],
        )
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert x.keys() == y.keys() and max(abs(x[k] - y[k]) for k in x) < 1e-4


def test_launch_1p1d_script(checkpoints):
    import re
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "launch_1p1d.py")
    r = subprocess.run(
        [
            sys.executable,
            script,
            "--model",
            checkpoints["ouro"],
            "--max-tokens",
            "5",
            "--exit-threshold",
            "0.5",
            "--option",
            "prefill_worker_chunk=64",
        ],
        input="The river runs\nOnce upon a time\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "prefill pid" in r.stderr and "decode pid" in r.stderr and "on cpu" in r.stderr
    stats = re.findall(
        r"\[req-(\d)\] 5 tokens \(length\), exit depths \[4, .*\], TTFT ([\d.]+) ms, TPOT ([\d.]+) ms",
        r.stdout,
    )
    assert sorted(s[0] for s in stats) == ["0", "1"]
    assert all(float(ttft) > 0 and float(tpot) > 0 for _, ttft, tpot in stats)
    bad = subprocess.run(
        [
            sys.executable,
            script,
            "--model",
            checkpoints["ouro"],
            "--option",
            "prefill_worker_chunk=0",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        bad.returncode == 2 and "prefill_worker_chunk must be an integer >= 1, got 0" in bad.stderr
    )


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_launch_1p1d_ctrl_c_exits_with_one_line_and_leaves_nothing(checkpoints, tmp_path, sig):
    """Ctrl-C (or SIGTERM, handled alike; SIGHUP too, rlt/control/run.py) stops both workers."""
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "launch_1p1d.py")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with as_from_a_terminal(
        [sys.executable, script, "--model", checkpoints["ouro"], "--max-tokens", "60000", "hello"],
        env,
    ) as p:
        wait_for_ready_workers(p.pid, 2, timeout=120)
        time.sleep(0.5)  # (decoding)
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
        assert p.returncode == 130 and err.strip().splitlines()[-1] == "launch_1p1d: interrupted", (
            err
        )
        assert "Traceback" not in err, err
        assert not any(tmp_path.glob("rlt-*"))
        assert not rlt_processes_of(p.pid)
