import atexit
import contextlib
import fcntl
import json
import os
import shutil
import tempfile

# (as rlt's workers: no spinning threads on 2 shared cores)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from rlt.models.family import BY_NAME

# Under pytest-xdist (`--numprocesses 2` in pyproject's addopts) each worker process gets a temp dir
# and an rlt cache of its own, inherited by the servers and workers its tests start: tests that
# count
# the coordinators' rlt-* dirs in $TMPDIR, or launches that prune old log dirs under the cache,
# never
# see another worker's.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...; None when not under xdist
if WORKER:
    os.environ["TMPDIR"] = tempfile.tempdir = tempfile.mkdtemp(prefix=f"{WORKER}-")
    atexit.register(shutil.rmtree, tempfile.tempdir, True)
rlt_cache = os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "rlt")
os.environ.setdefault("RLT_CACHE_DIR", os.path.join(rlt_cache, WORKER) if WORKER else rlt_cache)
torch.set_num_threads(2)
MACHINE_LOCK = os.path.join(rlt_cache, "machine.lock")  # shared by the xdist workers (see _alone)

FAMILIES = tuple(BY_NAME)  # short names: ouro, nanbeige, huginn


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """One tiny float32 checkpoint per family, made by the product's own checkpoint maker."""
    from rlt.models.checkpoint import make_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    return {f: make_checkpoint(f, str(root / f), preset="tiny", seed=1) for f in FAMILIES}


@pytest.fixture(scope="session")
def served(checkpoints):
    """family -> the base URL of `rlt serve` of its tiny checkpoint with the serve tests' default
    flags (Huginn at 6 loops: tests/helpers.py's HUGINN), started when first asked for and kept for
    the session: for the tests that only send requests (test_serve, test_serve_structured,
    test_serve_tools, test_grammar_after_reasoning, test_lm_eval)."""
    from tests.helpers import HUGINN
    from tests.serve.helpers import serving

    urls = {}
    with contextlib.ExitStack() as servers:

        def url(family: str) -> str:
            if family not in urls:
                flags = ["--trust-request-chat-template"]  # (tests give templates of their own)
                flags += ["--hf-overrides", json.dumps(HUGINN)] if family == "huginn" else []
                urls[family] = servers.enter_context(serving(checkpoints[family], *flags))
            return urls[family]

        yield url


@pytest.fixture(scope="session")
def ouro_server(served):
    return served("ouro")


def pytest_asyncio_loop_factories(config, item):
    """Async tests run on uvloop (the loop users embed rlt in); pytest-asyncio 1.x hook."""
    import uvloop

    return {"uvloop": uvloop.new_event_loop}


def pytest_addoption(parser, pluginmanager):
    """Without pytest-xdist (not installed, or `-p no:xdist` as the GPU suite runs), addopts'
    `--numprocesses 2 --dist loadfile` are accepted and the tests run in this one process."""
    if not pluginmanager.has_plugin("xdist"):
        parser.addoption("--numprocesses", help="(pytest-xdist is not loaded: ignored)")
        parser.addoption("--dist", help="(pytest-xdist is not loaded: ignored)")


def _lock(kind: int) -> int:
    os.makedirs(rlt_cache, exist_ok=True)
    fd = os.open(MACHINE_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, kind)
    return fd


@pytest.fixture(autouse=True, scope="module")
def _alone(request):
    """A module marked `alone` has the machine to itself while its tests run: under xdist the other
    worker's next test waits (each test holds a shared lock, such a module the exclusive one). For
    tests whose outcome rests on timing that a second busy worker on two cores would upset."""
    if request.node.get_closest_marker("alone") is None:
        yield
        return
    fd = _lock(fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


@pytest.fixture(autouse=True)
def _shared(request):
    # (its module holds the exclusive lock)
    if request.node.get_closest_marker("alone") is not None:
        yield
        return
    fd = _lock(fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)
