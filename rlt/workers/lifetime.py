"""A worker-side process's tie to its parent."""

import ctypes
import signal


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies, whatever it is doing (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
