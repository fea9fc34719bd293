"""rlt.Engine with real worker subprocesses and real ZeroMQ sockets."""

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import msgspec
import pytest
import pytest_asyncio

import rlt
from rlt import EngineDeadError, RequestError, SamplingParams
from rlt.contract.config import Faults
from tests.control.helpers import alive, collect, direct, workload
from tests.helpers import FAST, all_blocks_free
from tests.processes import parent, workers_of


async def test_concurrent_streams_match_direct_engine(checkpoints):
    path = checkpoints["ouro"]
    reqs = workload(40)
    async with rlt.Engine.launch(path, **FAST) as engine:
        pid = engine.stats().workers[0].pid
        finals = await asyncio.gather(
            *(collect(engine, p, sp, rid) for rid, (p, sp) in reqs.items())
        )
        expected = direct(path, reqs)
        for out in finals:
            assert (out.token_ids, out.exit_depths) == expected[out.request_id]
            assert out.finish_reason == "length"
        assert len({tuple(o.exit_depths) for o in finals}) > 1
        await all_blocks_free(engine)
        w = engine.stats().workers[0]  # the CPU compiles and captures nothing, ever
        assert w.captures_after_ready == w.compiles_after_ready == 0
        plain = msgspec.to_builtins(engine.stats())  # typed structs; plain dicts for JSON
        assert json.loads(json.dumps(plain))["workers"][0]["pid"] == pid
    assert not alive(pid)


BAD = [
    ([], SamplingParams(), "prompt must be a non-empty"),
    ([1, 512], SamplingParams(), "outside the vocabulary [0, 512)"),
    ([1, -1], SamplingParams(), "outside the vocabulary"),
    ([1, True], SamplingParams(), "token id True at index 1 is outside the vocabulary"),
    ([1, 2.0], SamplingParams(), "token id 2.0 at index 1 is outside the vocabulary"),
    ([1], SamplingParams(max_tokens=0), "max_tokens must be >= 1"),
    ([1], SamplingParams(max_tokens=70000), "exceeds the model's max positions 65536"),
    ([1], SamplingParams(temperature=-0.5), "temperature must be >= 0"),
    ([1], SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
    ([1], SamplingParams(top_p=1.5), "top_p must be in (0, 1]"),
    ([1], SamplingParams(top_k=-2), "top_k must be >= -1"),
    ([1], SamplingParams(min_loops=0), "min_loops must be >= 1"),
    ([1], SamplingParams(min_loops=3, max_loops=2), "min_loops must be <= max_loops (2)"),
    ([1], SamplingParams(max_loops=5), "max_loops must be <= the model's depth 4"),
    ([1], SamplingParams(exit_threshold=-0.1), "exit_threshold must be in [0, 1]"),
    ([1], SamplingParams(exit_threshold=1.1), "exit_threshold must be in [0, 1]"),
    (
        [1],
        SamplingParams(stop_token_ids=[600]),
        "stop_token_ids entry must be <= vocab size - 1 (511)",
    ),
    ([1], SamplingParams(logprobs=-1), "logprobs must be >= 0"),
    ([1], SamplingParams(temperature=float("nan")), "temperature must be a finite number"),
]


async def wait_restart(engine, old_pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = engine.stats().workers
        if ws and ws[0].pid != old_pid:
            try:
                return await collect(
                    engine, [1, 2], SamplingParams(max_tokens=2, temperature=0), "probe"
                )
            except EngineDeadError:
                pass
        await asyncio.sleep(0.1)
    raise AssertionError("worker did not come back")


async def test_a_long_prompt_chunk_is_not_a_hung_worker(checkpoints):
    """An 8,000-token prompt in one chunk on the CPU at a 2 s heartbeat deadline: the pass is long,
    but every layer moves the worker's progress (and a prefix-free chunk runs as flash SDPA), so the
    healthy worker is not killed and the request completes."""
    ids = [3 + i % 500 for i in range(8000)]
    options = FAST | dict(heartbeat_timeout=2.0, prefill_chunk=8192, max_num_batched_tokens=8192)
    async with rlt.Engine.launch(checkpoints["ouro"], **options) as engine:
        pid = engine.stats().workers[0].pid
        out = await collect(
            engine, ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        )
        assert out.finish_reason == "length" and engine.stats().workers[0].pid == pid


def restarted(workers, old: list[int]) -> bool:
    """Every worker ready again, in a new process."""
    return all(w.state == "ready" and w.pid not in old and alive(w.pid) for w in workers)


async def test_cpu_workers_fork_from_a_server_whose_death_takes_them_along(checkpoints):
    """CPU workers are children of this process's fork server, which the next launch reuses; a
    SIGKILLed server takes its workers along (their death signal), the engine restarts them from a
    new server and they give the same tokens."""
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    async with rlt.Engine.launch(checkpoints["ouro"], **FAST) as engine:
        first = await collect(engine, [5, 6, 7], sp)
        (server,) = {parent(w.pid) for w in engine.stats().workers}
    async with rlt.Engine.launch(checkpoints["ouro"], topology="2x", **FAST) as engine:
        pids = [w.pid for w in engine.stats().workers]
        assert [parent(p) for p in pids] == [server, server] and parent(server) == os.getpid()
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (
            alive(server)
            or any(alive(p) for p in pids)
            or not restarted(engine.stats().workers, pids)
        ):
            assert time.monotonic() < deadline, engine.stats().workers
            await asyncio.sleep(0.05)
        (new,) = {parent(w.pid) for w in engine.stats().workers}
        assert new not in (server, os.getpid()) and parent(new) == os.getpid()
        outs = await asyncio.gather(*(collect(engine, [5, 6, 7], sp) for _ in range(2)))
        assert [o.token_ids for o in outs] == [first.token_ids] * 2


async def test_startup_failure_reports_cause_and_leaves_no_process(checkpoints, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(checkpoints["ouro"], bad)
    w = load_file(str(bad / "model.safetensors"))
    del w["model.layers.0.mlp.up_proj.weight"]
    save_file(w, str(bad / "model.safetensors"))
    before = set(children())
    with pytest.raises(
        RuntimeError, match="failed to start: .*missing tensor 'model.layers.0.mlp.up_proj.weight'"
    ):
        async with rlt.Engine.launch(str(bad), **FAST):
            pass
    assert set(children()) <= before


def temp_dirs() -> set[str]:
    """The coordinators' private temp dirs ($TMPDIR/rlt-*) that exist now."""
    import tempfile

    return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("rlt-")}


def children() -> list[int]:
    """This process's workers, and any other child process."""
    return [p for p in workers_of(os.getpid()) if alive(p)]


async def test_engine_never_stalls_the_callers_loop(checkpoints):
    """A loop-lag probe (a task sleeping 2 ms at a time) through launch, 32 streams of text prompts
    detokenized as they go (some aborted) and shutdown: the engine never holds the loop over 20 ms.
    Measured in the loop thread's CPU time between two wakes (the work that ran in between): a busy
    machine that takes the core away does not count, as wall time would."""
    lags = []

    async def probe():
        while True:
            t = time.thread_time()
            await asyncio.sleep(0.002)
            lags.append(time.thread_time() - t)

    tick = asyncio.ensure_future(probe())
    await asyncio.sleep(0.01)
    async with rlt.Engine.launch(checkpoints["ouro"], **FAST) as engine:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        launch_lag, launched = max(lags), len(lags)

        async def one(i):
            sp = SamplingParams(max_tokens=24, temperature=0.8, seed=i, ignore_eos=True)
            async for out in engine.generate("the quick brown fox " * (1 + i % 7), sp):
                if i % 5 == 0 and len(out.token_ids) >= 3:
                    # an abort (tokens that arrived while the consumer was busy come in one output)
                    break
            return out

        finals = await asyncio.gather(*(one(i) for i in range(32)))
        aborted = [(3 <= len(o.token_ids) < 24, o.finished) for o in finals[::5]]
        assert aborted == [(True, False)] * len(aborted)
        assert all(len(o.token_ids) == 24 and o.finished for i, o in enumerate(finals) if i % 5)
        assert all(o.text for o in finals)
    tick.cancel()
    # the probe ran throughout (a launch from a warm fork server takes some 50 ms)
    assert launched >= 10 and len(lags) > launched + 50
    assert launch_lag < 0.02, f"launch held the loop {launch_lag * 1e3:.1f} ms"
    assert max(lags) < 0.02, f"the loop stalled {max(lags) * 1e3:.1f} ms"


async def test_launch_rejects_bad_options_before_spawning(checkpoints):
    before, dirs = set(children()), temp_dirs()
    for kwargs, msg in [
        (dict(topology="1p0d"), "topology .1p0d."),
        (dict(topology="pd"), "topology .pd."),
        (dict(dtype="int8"), "dtype 'int8'"),
        (dict(device="tpu"), "device 'tpu'"),
        (dict(bogus=1), "unknown option 'bogus'"),
        (dict(block_size=0), "block_size must be"),
        (dict(kv_layout="x"), "kv_layout 'x'"),
        (dict(steady_decode=True), "steady_decode True is not supported .adaptive, always, never."),
        (
            dict(topology="1p1d", max_local_prefill_length=-1),
            "max_local_prefill_length must be an integer >= 0, got -1",
        ),
        (
            dict(max_prefill_queue_size=2),
            "max_prefill_queue_size applies to prefill/decode topologies .XpYd., not 'single'",
        ),
        (
            dict(topology="1p1d", prefill_worker_chunk=0),
            "prefill_worker_chunk must be an integer >= 1, got 0",
        ),
        (
            dict(max_num_batched_tokens=None),
            "max_num_batched_tokens must be an integer >= 1, got None",
        ),
        (dict(heartbeat_timeout="2"), "heartbeat_timeout must be a number > 0, got '2'"),
        (dict(heartbeat_timeout=0), "heartbeat_timeout must be a number > 0, got 0"),
        (dict(heartbeat_timeout=-1), "heartbeat_timeout must be a number > 0, got -1"),
        (dict(heartbeat_interval=0), "heartbeat_interval must be a number >= 0.01, got 0"),
        (dict(heartbeat_interval=-1), "heartbeat_interval must be a number >= 0.01, got -1"),
        (dict(heartbeat_interval=1e-9), "heartbeat_interval must be a number >= 0.01, got 1e-09"),
        (
            dict(heartbeat_interval=3, heartbeat_timeout=2),
            "heartbeat_interval 3 must be < heartbeat_timeout 2 .a worker would be declared dead between two",
        ),
        (dict(kv_memory_bytes=0), "kv_memory_bytes must be an integer >= 1, got 0"),
        (dict(kv_memory_bytes=-1), "kv_memory_bytes must be an integer >= 1, got -1"),
        (
            dict(kv_memory_bytes=1000),
            "kv_memory_bytes 1000 holds no KV block: one block of 16 positions of this",
        ),
        (
            dict(topology="1p1d", transfer_timeout=-1),
            "transfer_timeout must be a number > 0, got -1",
        ),
        (dict(startup_timeout=0), "startup_timeout must be a number > 0, got 0"),
        (dict(restart="no"), "restart must be True or False, got 'no'"),
        (dict(restart_attempts=0), "restart_attempts must be an integer >= 1, got 0"),
        (dict(topology=None), "topology must be str, got None"),
    ]:
        with pytest.raises(ValueError, match=msg):
            rlt.Engine.launch(checkpoints["ouro"], **kwargs)
    with pytest.raises(rlt.ConfigError, match="'total_ut_steps'"):
        rlt.Engine.launch(checkpoints["ouro"], hf_overrides={"total_ut_steps": 0})
    with pytest.raises(
        rlt.ConfigError, match="model must be a checkpoint directory's path or a hub id, got 123"
    ):
        rlt.Engine.launch(123)
    assert set(children()) == before and temp_dirs() == dirs


async def test_broken_model_files_are_named_at_launch(checkpoints, tmp_path):
    """config.json and the tokenizer's files: not JSON, not an object, not a tokenizer — each named;
    no process and no temp dir is left."""
    import shutil

    before, dirs = set(children()), temp_dirs()
    bad = tmp_path / "bad"
    shutil.copytree(checkpoints["ouro"], bad)
    good = {
        n: (bad / n).read_text() for n in ("config.json", "tokenizer.json", "tokenizer_config.json")
    }
    for name, text, msg in [
        ("config.json", "[1, 2]", "config.json is not a JSON object"),
        ("config.json", "{", "config.json cannot be read as JSON: Expecting property name"),
        ("tokenizer.json", "[]", "tokenizer.json is not a JSON object"),
        ("tokenizer.json", "{oops", "tokenizer.json cannot be read as JSON"),
        ("tokenizer.json", '{"model": 3}', "tokenizer.json does not load as a tokenizer: "),
        ("tokenizer_config.json", '"x"', "tokenizer_config.json is not a JSON object"),
    ]:
        (bad / name).write_text(text)
        with pytest.raises(rlt.ConfigError, match=re.escape(f"{bad}/{msg}")):
            await rlt.Engine.launch(str(bad), **FAST)
        (bad / name).write_text(good[name])
    (bad / "config.json").unlink()
    with pytest.raises(rlt.ConfigError, match=re.escape(f"model path {bad} has no config.json")):
        rlt.Engine.launch(str(bad))
    assert set(children()) == before and temp_dirs() == dirs


async def test_entry_checks_name_the_device_and_the_file(checkpoints, tmp_path):
    """No CUDA here: asking for it fails at launch with the count, before any worker; a missing
    path, a corrupt config.json and a truncated safetensors file are named."""
    import shutil

    before, dirs = set(children()), temp_dirs()
    for kwargs, msg in [
        (
            dict(device="cuda"),
            "device 'cuda' with topology 'single' needs 1 CUDA device(s); this machine has 0",
        ),
        (dict(device="cuda", topology="1p1d"), "needs 2 CUDA device"),
    ]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            await rlt.Engine.launch(checkpoints["ouro"], **kwargs)
    assert set(children()) == before
    with pytest.raises(rlt.ConfigError, match=f"model path {tmp_path}/nowhere does not exist"):
        rlt.Engine.launch(str(tmp_path / "nowhere"))
    bad = tmp_path / "bad"
    shutil.copytree(checkpoints["ouro"], bad)
    (bad / "config.json").write_text('{"model_type": "ouro",')
    with pytest.raises(
        rlt.ConfigError, match=re.escape(f"{bad}/config.json cannot be read as JSON")
    ):
        rlt.Engine.launch(str(bad))
    shutil.copy(os.path.join(checkpoints["ouro"], "config.json"), bad / "config.json")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(RuntimeError, match=re.escape(f"{weights} cannot be read as safetensors")):
        await rlt.Engine.launch(str(bad), **FAST)
    assert set(children()) == before and temp_dirs() == dirs


def test_pd_without_nixl_names_the_extra(checkpoints, monkeypatch):
    """A single-engine install has no NIXL: asking for a PD topology says which extra to install
    (find_spec faked to report NIXL missing); single needs no NIXL."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nixl" else real(name, *a)
    )
    with pytest.raises(
        ValueError,
        match=r"topology '1p1d' moves KV between workers over NIXL, which is not "
        r"installed: pip install 'rlt\[pd\]'",
    ):
        rlt.Engine.launch(checkpoints["ouro"], topology="1p1d")
    rlt.Engine.launch(checkpoints["ouro"])  # (not awaited: nothing is spawned)


async def test_stuck_main_loop_is_detected(checkpoints):
    """A worker whose heartbeat thread still beats but whose main loop hangs with work is killed."""
    async with rlt.Engine.launch(
        checkpoints["ouro"], faults=Faults(stall_first_token=77), **FAST
    ) as engine:
        pid = engine.stats().workers[0].pid
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="main loop stuck"):
            async for _ in engine.generate([77, 1, 2], SamplingParams(max_tokens=5)):
                pass
        assert time.monotonic() - t0 < FAST["heartbeat_timeout"] + 3.0
        assert (await wait_restart(engine, pid)).finished
        await all_blocks_free(engine)


async def test_replicas_topology_spreads_requests_and_matches_single(checkpoints):
    reqs = workload(12)
    expected = direct(checkpoints["ouro"], reqs)
    async with rlt.Engine.launch(checkpoints["ouro"], topology="2x", **FAST) as engine:
        assert [w.role for w in engine.stats().workers] == ["unified", "unified"]
        streams = [engine.generate(p, sp, rid) for rid, (p, sp) in reqs.items()]
        used = {engine._lifecycle.live[rid].decode.worker.pid for rid in reqs}
        finals = []
        for s in streams:
            async for out in s:
                pass
            finals.append(out)
        assert len(used) == 2  # least-loaded routing used both replicas
        for out in finals:
            assert (out.token_ids, out.exit_depths) == expected[out.request_id]
        await all_blocks_free(engine)


async def test_serving_benchmark_metrics(checkpoints):
    """The serving benchmark's measurement: every arrival of the Poisson draw completes, vLLM's
    metrics agree with each other and with the per-request records."""
    from rlt.bench.serving import EngineTarget, one_rate, warm_up

    async with rlt.Engine.launch(checkpoints["nanbeige"], **FAST) as engine:
        target = EngineTarget(engine)
        await warm_up(target, [8, 40], 6)
        row = await one_rate(
            target, rate=8.0, duration=2.0, prompt_lens=[8, 40], output_len=6, seed=3
        )
    rng, t, n = random.Random(3), 0.0, 0
    while True:  # the same Poisson draw: every arrival completed
        t += rng.expovariate(8.0)
        if t > 2.0:
            break
        n += 1
    assert row["completed"] == n > 5 and row["total_output_tokens"] == 6 * n
    assert (
        row["mean_ttft_ms"] <= row["mean_e2el_ms"] and row["median_ttft_ms"] <= row["p99_ttft_ms"]
    )
    assert row["output_throughput_tok_s"] == pytest.approx(6 * n / row["duration_s"], rel=0.02)
    # per request, arrival order
    assert [r[0] for r in row["requests"]] == [(8, 40)[i % 2] for i in range(n)]
    assert n < 50 and max(r[1] for r in row["requests"]) == pytest.approx(
        row["p99_ttft_ms"], abs=0.02
    )


def test_saturation_heuristic():
    """The serving sweep stops after the first rate past capacity: the run took over 10 % longer
    than the draw's own arrival span plus one median E2EL, or some prompt length's TTFT queue grew."""
    from rlt.bench.serving import saturated

    def row(req_s, arrivals_s, requests=()):
        return {
            "completed": 100,
            "request_throughput_req_s": req_s,
            "arrival_rate_req_s": arrivals_s,
            "median_e2el_ms": 400.0,
            "requests": list(requests),
        }

    assert not saturated(row(0.97, 1))  # keeps up
    assert saturated(row(1.3, 2))  # 100 / 1.3 s > (99 / 2 + 0.4) / 0.9
    # against the draw's own rate
    assert not saturated(row(0.417, 0.43)) and saturated(row(0.30, 0.43))
    assert saturated({"completed": 1})  # too few completions to tell

    def queue(first, last):
        return row(
            0.97, 1, [[128, first, 5.0]] * 25 + [[128, 100.0, 5.0]] * 50 + [[128, last, 5.0]] * 25
        )

    assert saturated(queue(200.0, 1000.0))
    assert not saturated(queue(200.0, 399.0))  # under twice
    assert not saturated(queue(20.0, 260.0))  # under 250 ms more
    # per prompt length: alternating lengths with steady TTFTs are no queue, the long prompts'
    # growing one is
    assert not saturated(
        row(0.97, 1, [[(128, 4096)[i % 2], (50.0, 310.0)[i % 2], 5.0] for i in range(13)])
    )
    grew = [
        [(128, 4096)[i % 2], (50.0, 310.0)[i % 2] + (400.0 if i >= 30 and i % 2 else 0.0), 5.0]
        for i in range(40)
    ]
    assert saturated(row(0.97, 1, grew))


async def test_a_dead_workers_cause_is_the_exception_in_its_log(tmp_path):
    """Its last traceback's exception line, not its last log line; nothing when it logged none."""
    from rlt.control.worker_proc import WorkerProc

    w = WorkerProc(0, 0, "decode", "cpu", 0, "ipc://x", str(tmp_path))
    with open(w.log_path, "w") as f:
        f.write(
            "loading\nTraceback (most recent call last):\n  File 'a.py', line 1\nKeyError: 'x'\n\n"
        )
        f.write("During handling of the above exception, another exception occurred:\n\n")
        f.write(
            "Traceback (most recent call last):\n  File 'b.py', line 2\n    raise OSError(28)\n"
        )
        f.write("OSError: [Errno 28] No space left on device\n[NIXL] I1201 agent ready\n")
    assert w.cause() == "OSError: [Errno 28] No space left on device"
    with open(w.log_path, "w") as f:
        f.write("[NIXL] I1201 agent ready\n")
    assert w.cause() is None and w.how_it_ended() == "stopped answering"
    w.kill("was killed after no heartbeat for 3.1 s (deadline 3.0 s)")
    assert (
        str(w.dead_error())
        == "decode worker 0 (pid None) was killed after no heartbeat for 3.1 s (deadline 3.0 s)"
    )


async def test_worker_logs_are_kept_in_a_directory_per_launch(checkpoints, tmp_path):
    """stats() names the launch's log directory; the worker's log (its heap frozen at READY) is still
    there after shutdown, and only the newest KEEP_RUNS launches' directories are kept."""
    from rlt.control.log_dir import KEEP_RUNS

    for i in range(KEEP_RUNS + 3):
        (tmp_path / f"20260101-0000{i:02d}-old").mkdir()
    (tmp_path / "mine").mkdir()  # not a launch's directory: never touched
    async with rlt.Engine.launch(checkpoints["ouro"], log_dir=str(tmp_path), **FAST) as engine:
        run = engine.stats().log_dir
        await collect(engine, [1, 2, 3], SamplingParams(max_tokens=2))
    assert os.path.dirname(run) == str(tmp_path) and os.listdir(run) == ["unified0.0.log"]
    # the heap frozen at READY: no full-heap collections
    with open(os.path.join(run, "unified0.0.log")) as f:
        frozen = re.search(r"heap frozen \((\d+) objects\)", f.read())
    assert frozen is not None and int(frozen[1]) > 10_000
    kept = sorted(os.listdir(tmp_path))
    assert len(kept) == KEEP_RUNS + 1 and "mine" in kept and os.path.basename(run) in kept
    # (23 old + 1 new - 20)
    assert "20260101-000003-old" not in kept and "20260101-000004-old" in kept


# The tests below only send requests to an Ouro engine with FAST's options and leave it as they
# found it (every block free, its one worker ready): they share one, launched for the module, and
# run one after another on the module's event loop (the engine's own tasks run on it).
on_the_shared_engine = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(checkpoints):
    async with rlt.Engine.launch(checkpoints["ouro"], **FAST) as engine:
        yield engine


@on_the_shared_engine
async def test_bad_input_raises_and_engine_keeps_serving(engine):
    sp = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    running = asyncio.ensure_future(collect(engine, [5, 6, 7], sp, "keep"))
    await asyncio.sleep(0.05)
    for prompt, params, message in BAD:
        with pytest.raises(RequestError) as e:
            engine.generate(prompt, params)
        assert message in str(e.value)
        assert isinstance(e.value, ValueError)
    with pytest.raises(RequestError, match="request_id 'keep' is already live"):
        engine.generate([1], sp, request_id="keep")
    # one prompt list for several requests is checked once, and again once changed
    shared = [5, 6, 7]
    await engine.generate(shared, sp).aclose()
    shared[1] = True
    with pytest.raises(RequestError, match="token id True at index 1"):
        engine.generate(shared, sp)
    # values that once passed validation and then broke a worker or the coordinator's sender
    for kwargs, message in [
        (dict(priority="high"), "priority must be an integer, got 'high'"),
        (dict(priority=2**64), f"priority must be <= {2**63 - 1}, got {2**64}"),
        (dict(params=SamplingParams(top_k=2**64)), f"top_k must be <= {2**63 - 1}, got {2**64}"),
        (dict(prompt="a \ud800 b"), "prompt text cannot be tokenized"),
        (dict(request_id=""), "request_id must be a non-empty string"),
    ]:
        with pytest.raises(RequestError, match=re.escape(message)):
            engine.generate(**({"prompt": [1], "params": sp} | kwargs))
    out = await running
    assert len(out.token_ids) == 30
    await all_blocks_free(engine)


@on_the_shared_engine
async def test_a_paused_machine_kills_no_healthy_worker(engine):
    """The whole machine paused past the heartbeat deadline (a VM descheduled, a laptop suspended):
    the worker and the caller's loop stop and resume together, a stream open. The coordinator's
    heartbeat watch wakes late too; it does not declare the worker dead for a silence it shared."""
    pid = engine.stats().workers[0].pid
    stream = engine.generate([5, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True))
    await anext(stream)
    os.kill(pid, signal.SIGSTOP)
    await asyncio.sleep(0.1)  # (what it sent before it stopped is read)
    time.sleep(FAST["heartbeat_timeout"] + 1.0)  # (the loop stopped too)
    os.kill(pid, signal.SIGCONT)
    outs = [o async for o in stream]
    assert outs[-1].finished and len(outs[-1].token_ids) == 40
    await asyncio.sleep(4 * FAST["heartbeat_interval"])
    assert [(w.pid, w.state) for w in engine.stats().workers] == [(pid, "ready")] and alive(pid)


@on_the_shared_engine
async def test_cpu_worker_keeps_its_speed_beside_busy_processes(engine):
    """Two busy processes on the CPU's cores: the worker's OpenMP threads wait passively instead of
    spinning, so 16 requests cost the worker about a second of CPU (spinning threads burned it for
    over a minute). Measured in the worker's CPU time, which a busy machine does not stretch."""

    def cpu_seconds(pid: int) -> float:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        pid = engine.stats().workers[0].pid
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert b"OMP_WAIT_POLICY=PASSIVE" in f.read().split(b"\0")
        cpu = cpu_seconds(pid)
        sp = SamplingParams(max_tokens=16, ignore_eos=True)
        outs = await asyncio.gather(
            *(collect(engine, [3 + i * j % 400 for j in range(100)], sp) for i in range(16))
        )
        assert [len(o.token_ids) for o in outs] == [16] * 16
        assert cpu_seconds(pid) - cpu < 10.0
    finally:
        for p in spin:
            p.kill()
            p.wait()
