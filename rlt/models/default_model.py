"""The embedded default: a tiny Ouro checkpoint made on first use in the user's cache directory."""

import os
import shutil
import tempfile

from rlt.envs import cache_dir

DEFAULT_NAME = "ouro-tiny-v1"


def default_model_path() -> str:
    path = os.path.join(cache_dir(), DEFAULT_NAME)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    from rlt.models.checkpoint import make_checkpoint

    os.makedirs(cache_dir(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".making-", dir=cache_dir())
    make_checkpoint("ouro", tmp, preset="tiny", seed=0)
    try:
        os.rename(tmp, path)  # atomic: a concurrent maker either wins or finds ours
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
