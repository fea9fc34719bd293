"""Looking for processes from the tests (no psutil)."""

import os


def cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains text (e.g. a run's temporary directory)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and text in cmdline(d)]
