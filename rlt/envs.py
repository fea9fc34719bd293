"""Every environment variable rlt reads, in one place (nothing else in rlt/ reads os.environ).

Variables are read when asked for, not at import, so a test or launcher may set them first.
"""

import os

ENVIRONMENT = {
    "RLT_CACHE_DIR": "where the embedded default checkpoint is made (default $XDG_CACHE_HOME/rlt, else ~/.cache/rlt)",
    "RLT_PDL": "0 turns programmatic dependent launch off for the decode kernels (an escape hatch: "
    "on by default on Hopper and later)",
    "OMP_WAIT_POLICY": "workers default it to PASSIVE (see worker_environ)",
    "UCX_TLS": "UCX's own (read by NIXL); repeated in the worker log beside its NIXL agent's name",
    "UCX_NET_DEVICES": "UCX's own (read by NIXL); repeated in the worker log beside its NIXL agent's name",
    "HF_HOME, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE": "huggingface_hub's own, when a model is a hub id",
}


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.environ.get("RLT_CACHE_DIR") or os.path.join(base, "rlt")


def pdl_enabled() -> bool:
    return os.environ.get("RLT_PDL", "1") != "0"


def worker_environ() -> dict[str, str]:
    """A worker process's environment: the coordinator's, with OpenMP threads that sleep rather
    than spin while they wait (unless the user chose otherwise). Spinning threads of several
    processes sharing a CPU's cores (a PD topology, the coordinator, other programs) stall each
    other: a CPU decode ran 50-100x slower under load with spinning, not with passive waits."""
    return {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


# Read while torch and the worker's modules are imported: a CPU worker forked from a server that
# imported them with other values would not see its own (rlt/control/forkserver.py keys servers by
# them).
_IMPORT_TIME = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH")
_IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_")


def import_time(environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of environ that take effect at import."""
    return tuple(
        sorted(
            (k, v)
            for k, v in environ.items()
            if k in _IMPORT_TIME or k.startswith(_IMPORT_TIME_PREFIXES)
        )
    )


def replace_environ(environ: dict[str, str]) -> None:
    """This process's environment becomes environ (a forked worker's own)."""
    os.environ.clear()
    os.environ.update(environ)


def ucx_settings() -> dict[str, str]:
    """The UCX variables that choose the KV transport, as this process sees them (for its log)."""
    return {k: os.environ.get(k, "(UCX's default)") for k in ("UCX_TLS", "UCX_NET_DEVICES")}
