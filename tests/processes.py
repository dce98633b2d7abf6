"""Helpers for tests that start processes: the installed console script, a free local port, a bounded stop, and the
one bounded wait every test polls through (:func:`wait_for`, :func:`wait_until`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

T = TypeVar("T")

#: The ``carls-dask`` console script of this environment: what a user runs after installing the package.
CARLS_DASK = os.path.join(os.path.dirname(sys.executable), "carls-dask")


def console_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell gives the console script: this one without ``PYTHONPATH``, plus ``extra``.

    Tests that run a command run :data:`CARLS_DASK` with this environment from a folder outside the
    checkout, so the command finds its modules through the installation alone.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group or session ``pgid``, read from ``/proc``.

    For a process started with ``start_new_session=True``, its pid is both: this lists what it started
    too, even a child that moved to a process group of its own.
    """
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:  # ended while we looked
            continue
        # fields after the command name (which may hold spaces, in parentheses): state ppid pgrp ...
        state, _ppid, pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
        if pgid in (int(pgrp), int(session)) and state != "Z":
            members.append(int(entry.name))
    return members


def stop_process(proc: subprocess.Popen[Any], timeout: float = 20.0, *, group: bool = False) -> None:
    """Terminate ``proc``, kill it if it has not ended within ``timeout`` seconds, and reap it.

    With ``group=True`` (for a process started with ``start_new_session=True``), the signals go to its
    whole process group, and whatever of the group outlives ``proc`` is killed too (each wait bounded).
    """
    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    if proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            proc.wait(timeout=timeout)
    if group and not wait_until(lambda: not group_members(proc.pid), timeout):
        send(signal.SIGKILL)


def wait_until(cond: Callable[[], T], timeout: float, *, interval: float = 0.1,
               sleep: Callable[[float], object] = time.sleep) -> T:
    """Call ``cond`` every ``interval`` seconds until it returns a true value or ``timeout`` seconds have passed.

    Returns the last value ``cond`` returned: true when the wait succeeded. ``cond`` may do a round of work
    each call (write once more, read a line) and may end the wait early by raising (a process that exited, a
    loop that failed). ``sleep`` waits between calls (the UI tests pass the browser page's own wait).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() >= deadline:
            return value
        sleep(interval)


def wait_for(cond: Callable[[], T], what: str | Callable[[], str], timeout: float, *, interval: float = 0.1,
             sleep: Callable[[float], object] = time.sleep) -> T:
    """:func:`wait_until` ``cond`` is true and return its value; fail when ``timeout`` seconds pass first.

    The failure says ``"<what> not within <timeout>s"``, or, when ``what`` is a function, what it returns
    then (a message that shows what was seen: a log's tail, the last status).
    """
    value = wait_until(cond, timeout, interval=interval, sleep=sleep)
    if not value:
        raise AssertionError(what() if callable(what) else f"{what} not within {timeout}s")
    return value


def read_count(stream: IO[str], least: int, what: str, timeout: float) -> int:
    """Read the counts a writer process prints, one integer a line, until one is at least ``least``; return it.

    Fails naming ``what`` when ``timeout`` seconds pass first (checked between lines: a writer that prints
    nothing more blocks the read until it ends).
    """
    return wait_for(lambda: (n if (n := int(stream.readline())) >= least else 0), what, timeout, interval=0)


#: Command-line parts of descendants the suite does not own: Python's multiprocessing helpers, which end with
#: the process that started them.
NOT_OURS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def adopt_orphans() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    A grandchild whose parent ends is then reparented here, not to init, so it stays a descendant that
    :func:`live_descendants` finds. Returns whether the kernel agreed.
    """
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def live_descendants(exclude: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every live (not zombie) descendant of this process the suite owns."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.pid in exclude or child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(child.cmdline()) or child.name()
        except psutil.NoSuchProcess:
            continue
        if not any(part in cmdline for part in NOT_OURS):
            found.append((child.pid, cmdline))
    return found


def end_descendants(grace: float = 5.0, exclude: frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """Wait up to ``grace`` seconds for this process's descendants to end; kill and return those that did not."""
    import psutil

    left: list[tuple[int, str]] = []

    def ended() -> bool:
        left[:] = live_descendants(exclude)
        return not left

    wait_until(ended, grace)
    for pid, _ in left:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    return left
