"""Looking for processes from the tests (no psutil)."""

import contextlib
import os
import signal
import subprocess


def cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains text (e.g. a run's temporary directory). Each argument is
    followed by a space, the last one too: "--parent-pid 123 " (an rlt worker's last arguments)
    matches no worker of a process 1234, such as another test's server running alongside."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and text in cmdline(d)]


@contextlib.contextmanager
def as_from_a_terminal(argv: list[str], env: dict):
    """A command as a terminal runs it in the foreground: SIGINT at its default (a shell's background
    job, such as a test run started with `&`, would pass it on ignored), output piped. Killed on the
    way out, whatever the test found."""
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
