"""Where a launch's worker logs go: a directory of its own under LaunchConfig.log_dir (default
<cache dir>/logs), kept after shutdown so a user can read what a worker said; only the newest
KEEP_RUNS launches' directories are kept."""

import os
import re
import shutil
import tempfile
import time

from rlt import envs

KEEP_RUNS = 20
_RUN = re.compile(r"\d{8}-\d{6}-")


def new_run_dir(root: str | None) -> str:
    root = root or os.path.join(envs.cache_dir(), "logs")
    os.makedirs(root, exist_ok=True)
    run = tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=root)
    # oldest first (the name starts with the time)
    runs = sorted(d for d in os.listdir(root) if _RUN.match(d))
    for old in runs[: max(0, len(runs) - KEEP_RUNS)]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return run
