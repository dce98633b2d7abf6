"""Where the time of a bank call goes: per-stage CPU and wall time, recorded only while a profile is taken.

The client, the transport and the shard mark the end of each stage of a call with :func:`mark`
(``mark("client", "routing")``); the time since the previous mark in the same thread (or since
:func:`begin`) is added to that stage. While no profile is taken (the default) :func:`begin` and
:func:`mark` return at once, so the marks cost a function call each.

:func:`enable` turns recording on in one process (the benchmark runs it in the client and, through
``Client.run``, in every worker) and wraps ``distributed.protocol.dumps``/``loads`` so that the
serialisation and deserialisation of every message of that process is timed as the ``transport``
stages, whichever thread does it. :func:`thread_cpu` reads the CPU time of every thread of the
process: what a thread spent outside the marked stages is the rest of its work (in the event-loop
threads, the hop itself: sockets, message handling, waking the caller). ``benchmarks/bank_profile.py``
puts the two together into one table per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["begin", "disable", "enable", "enabled", "mark", "reset", "snapshot", "thread_cpu"]

_on = False
_lock = threading.Lock()
_local = threading.local()
#: (thread name, part, stage) -> [cpu seconds, wall seconds, marks]
_records: dict[tuple[str, str, str], list[float]] = {}
_wrapped: dict[str, Callable[..., Any]] = {}


def enabled() -> bool:
    """Whether this process records stages."""
    return _on


def begin() -> None:
    """Start timing in this thread: the next :func:`mark` measures from here."""
    if _on:
        _local.last = (time.thread_time(), time.perf_counter())


def mark(part: str, stage: str) -> None:
    """End ``stage`` of ``part`` (``"client"``, ``"transport"``, ``"shard"``) in this thread."""
    if _on:
        _add(part, stage)


def _add(part: str, stage: str) -> None:
    cpu, wall = time.thread_time(), time.perf_counter()
    last = getattr(_local, "last", None)
    _local.last = (cpu, wall)
    if last is None:
        return
    key = (threading.current_thread().name, part, stage)
    with _lock:
        rec = _records.setdefault(key, [0.0, 0.0, 0])
        rec[0] += cpu - last[0]
        rec[1] += wall - last[1]
        rec[2] += 1


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (distributed's ``dumps`` or ``loads``) timed as a transport stage of the calling thread."""
    stage = "serialization" if name == "dumps" else "deserialization"

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        begin()
        try:
            return fn(*args, **kwargs)
        finally:
            mark("transport", stage)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def enable() -> None:
    """Record stages in this process, with distributed's message (de)serialisation timed."""
    global _on
    from distributed import protocol

    with _lock:
        for name in ("dumps", "loads"):
            if name not in _wrapped:
                _wrapped[name] = getattr(protocol, name)
                setattr(protocol, name, _timed(name, _wrapped[name]))
        _on = True


def disable() -> None:
    """Stop recording and restore distributed's functions."""
    global _on
    from distributed import protocol

    with _lock:
        _on = False
        for name, fn in _wrapped.items():
            setattr(protocol, name, fn)
        _wrapped.clear()


def reset() -> None:
    """Forget what was recorded."""
    with _lock:
        _records.clear()


def snapshot() -> dict[str, Any]:
    """What was recorded, with every thread's CPU time now (see :func:`thread_cpu`)."""
    with _lock:
        stages = [[t, p, s, *rec] for (t, p, s), rec in _records.items()]
    return {"stages": stages, "threads": thread_cpu()}


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process by name (threads of one name summed)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):  # the thread ended meanwhile, or no per-thread clocks here
            continue
        out[t.name] = out.get(t.name, 0.0) + cpu
    return out
