"""Small file-system helpers for durable, atomic writes: fsync, atomic JSON replace, writer locks.

Everything here is plain POSIX through :mod:`os`; nothing imports Zarr, so the helpers are shared by the
snapshot, delta-log and metric modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

from carls_dask.errors import (
    CorruptStoreError,
    DeadlineExceeded,
    DiskReserveError,
    StoreLockedError,
    StoreNotFoundError,
)

__all__ = [
    "WriterLock",
    "atomic_write_json",
    "check_reserve",
    "format_bytes",
    "fsync_dir",
    "fsync_tree",
    "read_json",
    "short_lock",
]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (new, renamed or removed names) to disk."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_syncfs() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):  # not Linux/glibc: fall back to one fsync per file
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def fsync_tree(path: str | os.PathLike[str]) -> int:
    """Make every file and directory below ``path`` durable; return the bytes of the files.

    On Linux one ``syncfs`` of the file system holding ``path`` does it (one journal commit instead of
    one per file, which matters for a snapshot's hundreds of chunk files); elsewhere, or if that call
    fails, each file and directory is fsynced.
    """
    total = 0
    files = []
    for dirpath, _dirnames, filenames in os.walk(os.fspath(path)):
        for name in filenames:
            full = os.path.join(dirpath, name)
            total += os.stat(full).st_size
            files.append(full)
        files.append(dirpath)
    if _SYNCFS is not None:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _SYNCFS(fd) == 0:
                return total
        finally:
            os.close(fd)
    for full in files:
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return total


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: ``"1.5 GiB"``, ``"12.0 MiB"``, ``"512 B"``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def check_reserve(path: str | os.PathLike[str], nbytes: int, reserve: int, what: str) -> None:
    """Refuse a write of ``nbytes`` under ``path`` that would leave less than ``reserve`` bytes free on its disk.

    Called before anything of the write is done, so a refused write leaves nothing half written. The free
    space is read at each call (one ``statvfs``, a few microseconds). ``reserve <= 0`` checks nothing.

    Raises
    ------
    DiskReserveError
        Naming ``what``, the bytes asked for, the free space and the reserve (``carls.storage.disk-reserve``).
    """
    if reserve <= 0:
        return
    p = pathlib.Path(path)
    while not p.exists() and p != p.parent:  # the folder may not exist yet: its disk is its parent's
        p = p.parent
    free = shutil.disk_usage(p).free
    if free - int(nbytes) < reserve:
        raise DiskReserveError(
            f"{what}: writing {format_bytes(nbytes)} would leave {format_bytes(max(free - int(nbytes), 0))} free on "
            f"the disk of {path}, below the reserve of {format_bytes(reserve)} (carls.storage.disk-reserve); "
            "nothing was written. Free some space (or lower the reserve) and continue"
        )


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically: temp file, fsync, ``os.replace``, fsync the folder.

    A reader sees either the old file or the complete new one, never a torn mix, even if the process
    is killed part-way.
    """
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    data = json.dumps(obj, indent=1, sort_keys=True).encode()
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)


def read_json(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Read a JSON object, turning a missing or unreadable file into a project error naming ``what``."""
    p = pathlib.Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise StoreNotFoundError(f"{what}: no file at {p}") from None
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise CorruptStoreError(f"{what}: {p} is not valid JSON ({exc}); expected a JSON object") from None
    if not isinstance(obj, dict):
        raise CorruptStoreError(f"{what}: {p} holds a JSON {type(obj).__name__}; expected a JSON object")
    return obj


class WriterLock:
    """An exclusive, non-blocking ``flock`` on a lock file: one writer per store or shard.

    The lock is released when :meth:`release` is called or the process exits (the kernel drops it, so a
    killed writer never leaves a stale lock behind). A second holder, in this process or another, gets
    :class:`~carls_dask.errors.StoreLockedError` at once instead of waiting.

    Parameters
    ----------
    path : path-like
        The lock file; created if missing.
    what : str
        Names the locked object in the error message (e.g. ``"delta log of shard 3 in /run/bank"``).
    """

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        self.path = pathlib.Path(path)
        self.what = what
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(self._fd, 200, 0).decode(errors="replace").strip()
            os.close(self._fd)
            self._fd = None
            raise StoreLockedError(
                f"{what}: another writer holds {self.path}"
                + (f" ({holder})" if holder else "")
                + "; expected no other writer (close it first)"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()}".encode(), 0)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def short_lock(path: str | os.PathLike[str], what: str, timeout: float = 30.0, *, create: bool = True,
               check: Callable[[], None] | None = None, poll: float = 0.01) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for a short read-modify-write, waiting at most ``timeout`` s.

    Parameters
    ----------
    path
        The lock file.
    what
        What the lock guards, for the error message.
    timeout
        Seconds to wait for another holder to let go.
    create
        Create ``path`` when it is missing (else a missing file is :class:`FileNotFoundError`, raised
        before the lock is held).
    check
        Called between tries while another process holds the lock; what it raises ends the wait (for
        example a check that the holder is still alive).
    poll
        Seconds between tries.

    Raises
    ------
    DeadlineExceeded
        If another process held the lock for longer than ``timeout`` seconds.
    FileNotFoundError
        If ``create`` is false and ``path`` does not exist.
    """
    fd = os.open(os.fspath(path), os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if check is not None:
                    check()
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"{what}: {path} stayed locked for more than {timeout:g} s; expected a short hold"
                    ) from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
