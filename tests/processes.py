"""Looking for processes from the tests (no psutil)."""

import contextlib
import os
import signal
import subprocess
import time


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


def parent(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and parent(d) == pid]


def workers_of(coordinator: int) -> list[int]:
    """A coordinator process's rlt workers: its children, its fork server's (CPU workers) in the
    server's place; a process exiting (its command line gone) is none."""
    out = []
    for c in children(coordinator):
        cmd = cmdline(c)
        out += children(c) if "rlt.workers.forkserver_main" in cmd else [c] if cmd else []
    return out


def rlt_processes_of(coordinator: int) -> list[int]:
    """Every process a coordinator process started for its workers, its fork server included, even
    once the coordinator is gone: "--parent-pid <coordinator>" ends each one's command line (a
    worker forked from the server has the server's)."""
    return processes_mentioning(f"--parent-pid {coordinator} ")


def logging_to(directory: str) -> list[int]:
    """Processes whose stdout is a file in directory (an engine's workers: their logs are in its run
    directory), grammar compile processes (which inherit it) left out."""
    out, directory = [], os.path.realpath(directory)
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.dirname(
                os.readlink(f"/proc/{d}/fd/1")
            ) == directory and "grammar_zygote" not in cmdline(d):
                out.append(int(d))
        except OSError:
            continue
    return out


def wait_for_ready_workers(coordinator: int, count: int, timeout: float) -> list[int]:
    """Wait until `count` workers of a coordinator process have logged their ready line (the log
    is their stdout) -> their pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = []
        for pid in workers_of(coordinator):
            try:  # (a process whose stdout is not a file, such as a pipe, is no worker: not read)
                log = os.readlink(f"/proc/{pid}/fd/1")
                if os.path.isfile(log):
                    with open(log, "rb") as f:
                        if b") ready in " in f.read():
                            ready.append(pid)
            except OSError:
                continue
        if len(ready) >= count:
            return ready
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {count} workers of {coordinator} ready in {timeout} s")


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
