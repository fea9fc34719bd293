import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # (as rlt's workers: no spinning threads on 2 shared cores)

import pytest  # noqa: E402
import torch  # noqa: E402

from rlt.models.family import BY_NAME

os.environ.setdefault("RLT_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "rlt"))
torch.set_num_threads(2)

FAMILIES = tuple(BY_NAME)  # short names: ouro, nanbeige, huginn


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """One tiny float32 checkpoint per family, made by the product's own checkpoint maker."""
    from rlt.models.checkpoint import make_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    return {f: make_checkpoint(f, str(root / f), preset="tiny", seed=1) for f in FAMILIES}


@pytest.fixture(scope="session")
def ouro_server(checkpoints):
    """`rlt serve` of the tiny Ouro with test_serve's default flags (its base URL), started once for
    the tests that only send it requests (test_serve, test_serve_structured, test_lm_eval)."""
    from test_serve import serving

    with serving(checkpoints["ouro"]) as url:
        yield url


def pytest_asyncio_loop_factories(config, item):
    """Async tests run on uvloop (the loop users embed rlt in); pytest-asyncio 1.x hook."""
    import uvloop

    return {"uvloop": uvloop.new_event_loop}
