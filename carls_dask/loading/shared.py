"""A node-local shared loader: one producer transforms each epoch's data once into shared memory.

One segment in ``/dev/shm`` holds a header, the *static* arrays (written once: labels, test images,
the untransformed images) and a ring of ``slots`` epoch slots, each holding one epoch's transformed
arrays (e.g. the augmented training images). A :class:`SharedLoader` (the producer) fills epoch
0, 1, 2, ... in order in a thread of its process; any number of :class:`LoaderConsumer` on the same
node attach by name and read whichever epoch and rows they want, in their own order, as numpy views
of the segment (no copies).

Rules, all enforced through the header:

- **Bounded buffer.** A consumer *holds* the epoch it last asked for (until it asks for another or
  calls :meth:`LoaderConsumer.release`). The producer prefetches up to ``slots - 1`` epochs past the
  highest epoch asked for, without ever overwriting a held epoch. When a consumer asks for an epoch
  whose slot is held by a consumer ``slots`` or more epochs behind, that slow consumer is
  **detached**: its slot is overwritten and its next call raises :class:`ConsumerDetached`; it does
  not re-sync by itself (a caller may attach again, or compute the epoch itself). So a slow
  consumer never holds the others back by more than the ring.
- **Producer loss is an error.** Every wait has a deadline. A consumer checks the producer's pid
  (gone or a zombie: :class:`ProducerLost`, and the orphaned segment is unlinked) and its heartbeat
  (older than ``producer_timeout``: :class:`ProducerLost`); a transform that raised marks the loader
  failed and every consumer raises :class:`ProducerLost` with the producer's message.
- **Clean up.** :meth:`SharedLoader.close` unlinks the segment (consumers already attached keep
  their mapping; their next wait raises :class:`LoaderClosed`).

Header updates that must not interleave (registering, asking for an epoch, claiming a slot) take an
``fcntl`` lock on a small file next to the segment, released by the kernel if its holder dies.
Linux only (``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import mmap
import os
import pathlib
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from carls_dask.errors import (
    ConfigError,
    ConsumerDetached,
    DeadlineExceeded,
    LoaderClosed,
    LoaderError,
    ProducerLost,
)
from carls_dask.storage.fsutil import short_lock

__all__ = [
    "ArraySpec",
    "ConsumerDetached",
    "LoaderClosed",
    "LoaderConsumer",
    "LoaderError",
    "ProducerLost",
    "SharedLoader",
    "attach",
    "loader_exists",
    "shared_memory_available",
    "shared_memory_free",
]

logger = logging.getLogger(__name__)

SHM_DIR = pathlib.Path("/dev/shm")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_MAGIC = 0x4341524C534C4431  # "CARLSLD1"
_ALIGN = 64
_META_BYTES = 1 << 16  # the layout (JSON) and the producer's failure message
# header fields (int64 each)
(_F_MAGIC, _F_SLOTS, _F_CONSUMERS, _F_STATE, _F_PID, _F_BEAT, _F_PRODUCED, _F_HIGH, _F_META, _F_ERROR,
 _F_LIMIT) = range(11)
_FIXED = 16
_STARTING, _RUNNING, _CLOSED, _FAILED = 0, 1, 2, 3
_FREE, _ACTIVE, _DETACHED = 0, 1, 2
_POLL = 0.002
_POLL_MAX = 0.02
#: Seconds a wait for the loader's lock may last (holders keep it for microseconds).
LOCK_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one array of a loader (static, or one per epoch slot)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of the array."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @classmethod
    def of(cls, what: str, value: Any) -> ArraySpec:
        """An :class:`ArraySpec` from an array or a ``(shape, dtype)`` pair; ``what`` names it in errors."""
        if isinstance(value, np.ndarray):
            return cls(tuple(int(s) for s in value.shape), value.dtype.str)
        if isinstance(value, ArraySpec):
            return value
        try:
            shape, dtype = value
            dt = np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{what}: got {value!r}; expected an array or a (shape, dtype) pair") from exc
        if (not isinstance(shape, tuple | list) or
                any(isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 0 for s in shape)):
            raise ConfigError(f"{what}: shape {shape!r}; expected a tuple of ints >= 0")
        if dt.hasobject:
            raise ConfigError(f"{what}: dtype {dt}; expected a fixed-size numeric dtype, not object")
        return cls(tuple(int(s) for s in shape), dt.str)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"shared loader name {name!r}: expected 1-200 characters of letters, digits, '_', '.', '-' "
                          "starting with a letter or digit")
    return name


def _positive(what: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{what}={value!r}; expected an int >= {minimum}")
    return int(value)


def _seconds(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what}={value!r}; expected a positive number of seconds")
    return float(value)


def _segment(name: str) -> pathlib.Path:
    return SHM_DIR / name


def _lock_path(name: str) -> pathlib.Path:
    return SHM_DIR / f"{name}.lock"


def loader_exists(name: str) -> bool:
    """Whether a loader segment named ``name`` exists on this node."""
    return _segment(_check_name(name)).exists()


def _unlink(name: str) -> None:
    """Remove loader ``name``'s segment and lock file (a producer's last act, also at interpreter exit)."""
    for path in (_segment(name), _lock_path(name)):
        path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (read from ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclasses.dataclass(frozen=True)
class _Layout:
    slots: int
    consumers: int
    static: dict[str, ArraySpec]
    epoch: dict[str, ArraySpec]

    @property
    def header_words(self) -> int:
        return _FIXED + 2 * self.slots + 4 * self.consumers

    def offsets(self) -> tuple[dict[str, int], list[dict[str, int]], int]:
        pos = _align(8 * self.header_words) + _META_BYTES
        static = {}
        for k, spec in self.static.items():
            static[k] = pos
            pos = _align(pos + spec.nbytes)
        slots = []
        for _ in range(self.slots):
            one = {}
            for k, spec in self.epoch.items():
                one[k] = pos
                pos = _align(pos + spec.nbytes)
            slots.append(one)
        return static, slots, max(pos, 1)

    def to_json(self) -> str:
        return json.dumps({"slots": self.slots, "consumers": self.consumers,
                           "static": {k: [list(v.shape), v.dtype] for k, v in self.static.items()},
                           "epoch": {k: [list(v.shape), v.dtype] for k, v in self.epoch.items()}})

    @classmethod
    def from_json(cls, text: str) -> _Layout:
        d = json.loads(text)
        return cls(int(d["slots"]), int(d["consumers"]),
                   {k: ArraySpec(tuple(s), t) for k, (s, t) in d["static"].items()},
                   {k: ArraySpec(tuple(s), t) for k, (s, t) in d["epoch"].items()})


class _Segment:
    """The mapped segment: header words, the layout and array views."""

    def __init__(self, name: str, mm: mmap.mmap, layout: _Layout) -> None:
        self.name = name
        self.mm = mm
        self.layout = layout
        self.header = np.frombuffer(mm, dtype=np.int64, count=layout.header_words)
        s0 = _FIXED
        self.slot_epoch = self.header[s0:s0 + layout.slots]
        self.slot_writing = self.header[s0 + layout.slots:s0 + 2 * layout.slots]
        self.table = self.header[s0 + 2 * layout.slots:].reshape(layout.consumers, 4)  # state, pid, position, wanted
        static_at, slot_at, _ = layout.offsets()
        self.static = {k: self._view(spec, static_at[k]) for k, spec in layout.static.items()}
        self.slots = [{k: self._view(spec, at[k]) for k, spec in layout.epoch.items()} for at in slot_at]
        self.meta_at = _align(8 * layout.header_words)

    def _view(self, spec: ArraySpec, offset: int) -> np.ndarray:
        count = int(np.prod(spec.shape, dtype=np.int64))
        return np.frombuffer(self.mm, dtype=np.dtype(spec.dtype), count=count, offset=offset).reshape(spec.shape)

    def error(self) -> str:
        n = int(self.header[_F_ERROR])
        start = self.meta_at + int(self.header[_F_META])
        return bytes(self.mm[start:start + n]).decode("utf-8", "replace")

    def set_error(self, message: str) -> None:
        raw = message.encode("utf-8")[: _META_BYTES - int(self.header[_F_META])]
        start = self.meta_at + int(self.header[_F_META])
        self.mm[start:start + len(raw)] = raw
        self.header[_F_ERROR] = len(raw)

    def close(self) -> None:
        empty = np.empty(0, np.int64)
        self.header, self.slot_epoch, self.slot_writing = empty, empty, empty
        self.table = empty.reshape(0, 4)
        self.static, self.slots = {}, []
        with contextlib.suppress(BufferError):  # a caller still holds a view: the mapping goes with it
            self.mm.close()


@contextlib.contextmanager
def _locked(name: str, create: bool = False, check: Callable[[], None] | None = None,
            timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the loader's lock; only its creator makes the lock file, so a closed loader's is gone.

    While another process holds it, ``check`` runs between tries (a consumer's check of the producer:
    a producer stopped while holding the lock is then an error, not a hang), and after ``timeout``
    seconds the wait ends in :class:`LoaderError`.
    """
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(short_lock(_lock_path(name), f"shared loader {name!r}: its lock", timeout,
                                          create=create, check=check, poll=_POLL))
        except FileNotFoundError:
            raise LoaderClosed(f"shared loader {name!r}: no lock file {_lock_path(name)}; the loader was closed "
                               "or never created") from None
        except DeadlineExceeded as exc:
            raise LoaderError(f"{exc} (holds last microseconds)") from None
        yield


def _reserve(fd: int, size: int, name: str) -> None:
    """Give the segment ``size`` bytes of memory now, so a full ``/dev/shm`` is an error here and not a
    ``SIGBUS`` when the producer first writes a page (``ftruncate`` alone reserves nothing on tmpfs)."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return  # a file system without fallocate: the size is set, the pages come on first write
        free = shared_memory_free()
        raise LoaderError(f"shared loader {name!r}: needs {size / 1e6:.1f} MB in {SHM_DIR}, which has "
                          f"{free / 1e6:.1f} MB free ({exc.strerror}); free some, or load separately") from None


def shared_memory_available() -> bool:
    """Whether this node offers node-local shared memory for loaders: a writable ``/dev/shm`` (Linux)."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK | os.X_OK)


def shared_memory_free() -> int:
    """Bytes free in ``/dev/shm`` for an unprivileged writer (0 when there is none)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return int(st.f_bavail) * int(st.f_frsize)


def _map(name: str) -> _Segment:
    path = _segment(name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise LoaderError(f"shared loader {name!r}: no segment {path} on this node; "
                          "expected a producer to have created it (SharedLoader)") from None
    try:
        size = os.fstat(fd).st_size
        if size < 8 * _FIXED:
            raise LoaderError(f"shared loader {name!r}: segment {path} has {size} bytes; not a loader segment")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    head = np.frombuffer(mm, dtype=np.int64, count=_FIXED)
    if int(head[_F_MAGIC]) != _MAGIC:
        mm.close()
        raise LoaderError(f"shared loader {name!r}: segment {path} is not a loader segment (or not yet initialised)")
    slots, consumers = int(head[_F_SLOTS]), int(head[_F_CONSUMERS])
    meta_at = _align(8 * (_FIXED + 2 * slots + 4 * consumers))
    n = int(head[_F_META])
    layout = _Layout.from_json(bytes(mm[meta_at:meta_at + n]).decode("utf-8"))
    del head
    return _Segment(name, mm, layout)


Transform = Callable[[int, dict[str, np.ndarray]], Mapping[str, np.ndarray] | None]


class SharedLoader:
    """The producer of a node-local shared loader: creates the segment and fills epochs in a thread.

    Parameters
    ----------
    name
        The loader's name (the segment ``/dev/shm/<name>``); consumers attach by it.
    static
        Arrays written once into the segment (labels, test images, ...).
    epoch
        ``{name: (shape, dtype)}`` of the arrays of one epoch.
    transform
        ``transform(epoch, out)`` fills the views ``out[name]`` with epoch ``epoch``'s arrays (or returns
        a mapping of arrays of the declared shapes and dtypes, which are copied in). Called in the
        producer thread, in order 0, 1, 2, ...
    slots
        Epochs the ring holds (>= 1): the producer runs at most ``slots - 1`` epochs ahead, and a
        consumer ``slots`` epochs behind a faster one is detached.
    consumers
        Most consumers attached at once.
    epochs
        Epochs to produce in all (``None``: no end); the producer stops after epoch ``epochs - 1``.
    start
        Start the producer thread now (else call :meth:`start`).

    Raises
    ------
    ConfigError
        On a bad name, sizes or specs (nothing is created).
    LoaderError
        If a live loader of that name exists (a segment left by a dead producer is replaced).
    """

    def __init__(self, name: str, *, static: Mapping[str, np.ndarray], epoch: Mapping[str, Any],
                 transform: Transform, slots: int = 2, consumers: int = 16, epochs: int | None = None,
                 start: bool = True) -> None:
        self.name = _check_name(name)
        slots = _positive(f"SharedLoader {name!r}: slots", slots)
        self.epochs = None if epochs is None else _positive(f"SharedLoader {name!r}: epochs", epochs, minimum=0)
        consumers = _positive(f"SharedLoader {name!r}: consumers", consumers)
        if not callable(transform):
            raise ConfigError(f"SharedLoader {name!r}: transform={transform!r}; expected a callable(epoch, out)")
        if not isinstance(static, Mapping) or not isinstance(epoch, Mapping):
            raise ConfigError(f"SharedLoader {name!r}: static and epoch must be mappings of name to array/spec")
        for k, v in static.items():
            if not isinstance(v, np.ndarray):
                raise ConfigError(f"SharedLoader {name!r}: static[{k!r}] is {type(v).__name__}; expected a numpy array")
        static_specs = {str(k): ArraySpec.of(f"SharedLoader {name!r}: static[{k!r}]", v) for k, v in static.items()}
        epoch_specs = {str(k): ArraySpec.of(f"SharedLoader {name!r}: epoch[{k!r}]", v) for k, v in epoch.items()}
        for k in static_specs:
            if np.dtype(static_specs[k].dtype).hasobject:
                raise ConfigError(f"SharedLoader {name!r}: static[{k!r}] has dtype object; expected a numeric dtype")
        layout = _Layout(slots, consumers, static_specs, epoch_specs)
        meta = layout.to_json().encode("utf-8")
        if len(meta) > _META_BYTES // 2:
            raise ConfigError(f"SharedLoader {name!r}: layout description of {len(meta)} bytes; at most "
                              f"{_META_BYTES // 2} (fewer arrays)")
        self.transform = transform
        self.cpu_seconds = 0.0  #: CPU time the producer thread spent in ``transform``
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = threading.Lock()
        self._linger_until: float | None = None
        self._seg = self._create(layout, meta)
        self._unlinker = weakref.finalize(self, _unlink, self.name)  # also at exit, if close() is never called
        self._seg.header[_F_LIMIT] = -1 if self.epochs is None else self.epochs
        for k, v in static.items():
            self._seg.static[str(k)][...] = v
        self._seg.header[_F_BEAT] = time.monotonic_ns()
        self._seg.header[_F_STATE] = _RUNNING
        logger.info("shared loader %r: %d slots of %d arrays, %d static arrays, %.1f MB", name, slots,
                    len(epoch_specs), len(static_specs), len(self._seg.mm) / 1e6)
        if start:
            self.start()

    def _create(self, layout: _Layout, meta: bytes) -> _Segment:
        path = _segment(self.name)
        _, _, size = layout.offsets()
        with _locked(self.name, create=True):
            if path.exists():
                try:
                    old = _map(self.name)
                    pid, state = int(old.header[_F_PID]), int(old.header[_F_STATE])
                    old.close()
                except LoaderError:
                    pid, state = -1, _FAILED
                if state in (_STARTING, _RUNNING) and _pid_alive(pid):
                    raise LoaderError(f"shared loader {self.name!r}: a live producer (pid {pid}) already serves it; "
                                      "attach to it, or pick another name")
                logger.warning("shared loader %r: replacing a segment left by producer pid %d", self.name, pid)
                path.unlink(missing_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _reserve(fd, size, self.name)
                mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                path.unlink(missing_ok=True)
                _lock_path(self.name).unlink(missing_ok=True)  # nothing of this loader is left
                raise
            os.close(fd)
            head = np.frombuffer(mm, dtype=np.int64, count=layout.header_words)
            head[_F_SLOTS], head[_F_CONSUMERS] = layout.slots, layout.consumers
            head[_F_STATE], head[_F_PID], head[_F_META] = _STARTING, os.getpid(), len(meta)
            head[_F_BEAT] = time.monotonic_ns()
            head[_FIXED:_FIXED + layout.slots] = -1
            meta_at = _align(8 * layout.header_words)
            mm[meta_at:meta_at + len(meta)] = meta
            head[_F_MAGIC] = _MAGIC
            del head
            return _Segment(self.name, mm, layout)

    @property
    def static(self) -> dict[str, np.ndarray]:
        """The static arrays (views of the segment)."""
        return self._seg.static

    @property
    def produced(self) -> int:
        """Epochs produced so far."""
        return int(self._seg.header[_F_PRODUCED])

    def start(self) -> None:
        """Start the producer thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"shared-loader-{self.name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        seg = self._seg
        wait = _POLL
        try:
            while not self._stop.is_set():
                seg.header[_F_BEAT] = time.monotonic_ns()
                if self._unused():
                    self._release()
                    return
                slot = self._claim()
                if slot is None:
                    self._stop.wait(wait)
                    wait = min(wait * 2, _POLL_MAX)
                    continue
                wait = _POLL
                e = int(seg.header[_F_PRODUCED])
                t0 = time.thread_time()
                self._fill(e, seg.slots[slot])
                self.cpu_seconds += time.thread_time() - t0
                with _locked(self.name):
                    seg.slot_epoch[slot] = e
                    seg.slot_writing[slot] = 0
                    seg.header[_F_PRODUCED] = e + 1
        except Exception as exc:  # the consumers raise ProducerLost with this message
            logger.exception("shared loader %r: producer failed", self.name)
            if len(seg.header):
                seg.set_error(f"{type(exc).__name__}: {exc}")
                seg.header[_F_STATE] = _FAILED

    def _fill(self, e: int, out: dict[str, np.ndarray]) -> None:
        got = self.transform(e, out)
        if got is None:
            return
        for k, spec in self._seg.layout.epoch.items():
            if k not in got:
                raise LoaderError(f"shared loader {self.name!r}: transform of epoch {e} returned no {k!r}; "
                                  f"expected arrays {sorted(self._seg.layout.epoch)}")
            a = np.asarray(got[k])
            if a.shape != spec.shape or a.dtype != np.dtype(spec.dtype):
                raise LoaderError(f"shared loader {self.name!r}: transform of epoch {e} returned {k!r} of "
                                  f"{a.dtype}{list(a.shape)}; expected {np.dtype(spec.dtype)}{list(spec.shape)}")
            out[k][...] = a

    def _claim(self) -> int | None:
        """The slot to write the next epoch into, or ``None`` when nothing needs producing yet."""
        seg = self._seg
        n_slots = seg.layout.slots
        with _locked(self.name):
            e = int(seg.header[_F_PRODUCED])
            if self.epochs is not None and e >= self.epochs:
                return None  # all produced
            if e > max(int(seg.header[_F_HIGH]), 0) + n_slots - 1:
                return None  # far enough ahead of the highest epoch asked for
            slot = e % n_slots
            old = int(seg.slot_epoch[slot])
            active = seg.table[:, 0] == _ACTIVE
            holders = np.flatnonzero(active & (seg.table[:, 2] == old)) if old >= 0 else np.empty(0, np.int64)
            if holders.size:
                if not (active & (seg.table[:, 3] >= e)).any():
                    return None  # only prefetching: wait for the holder to move on
                seg.table[holders, 0] = _DETACHED
                logger.warning("shared loader %r: detached %d consumer(s) holding epoch %d, %d epochs behind one "
                               "waiting for epoch %d", self.name, holders.size, old, e - old, e)
            seg.slot_epoch[slot] = -1
            seg.slot_writing[slot] = 1
            return slot

    def close(self) -> None:
        """Stop the producer, mark the loader closed and unlink its segment (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._release()

    def close_when_unused(self, linger: float) -> None:
        """Close once no consumer is attached, or after ``linger`` seconds, whichever comes first.

        The producer goes on serving the consumers still attached meanwhile (this is what a loop that
        created the loader calls when it ends before the loops reading it). Returns at once.
        """
        linger = _seconds(f"SharedLoader {self.name!r}: linger", linger)
        if self._thread is None or not self._thread.is_alive():
            self.close()
            return
        self._linger_until = time.monotonic() + linger

    def _unused(self) -> bool:
        """Whether :meth:`close_when_unused` was called and its time has come."""
        if self._linger_until is None:
            return False
        seg = self._seg
        active = [int(pid) for state, pid in seg.table[:, :2] if state == _ACTIVE and _pid_alive(int(pid))]
        return not active or time.monotonic() > self._linger_until

    def _release(self) -> None:
        with self._closing:
            if not len(self._seg.header):
                return
            self._seg.header[_F_STATE] = _CLOSED
            with contextlib.suppress(LoaderError), _locked(self.name):
                self._unlinker()
            self._seg.close()
        logger.info("shared loader %r: closed", self.name)

    def __enter__(self) -> SharedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoaderConsumer:
    """One consumer of a shared loader (see :func:`attach`)."""

    def __init__(self, seg: _Segment, consumer: str, row: int, wait_timeout: float, producer_timeout: float) -> None:
        self.loader = seg.name
        self.name = consumer
        self._seg = seg
        self._row = row
        self.wait_timeout = wait_timeout
        self.producer_timeout = producer_timeout
        self.epoch: int | None = None  #: the epoch this consumer holds

    def __repr__(self) -> str:
        return f"LoaderConsumer({self.loader!r}, {self.name!r}, epoch={self.epoch})"

    @property
    def static(self) -> dict[str, np.ndarray]:
        """The static arrays (views of the segment)."""
        self._open()
        return self._seg.static

    @property
    def slots(self) -> int:
        """Epochs the loader's ring holds."""
        return self._seg.layout.slots

    def _open(self) -> None:
        if not len(self._seg.header):
            raise LoaderError(f"shared loader {self.loader!r}: consumer {self.name!r} is closed")

    def _who(self) -> str:
        return f"shared loader {self.loader!r}, consumer {self.name!r}"

    def _check(self) -> None:
        """Raise when this consumer was detached or the producer is closed, failed, dead or silent."""
        self._open()
        h = self._seg.header
        if int(self._seg.table[self._row, 0]) == _DETACHED:
            raise ConsumerDetached(f"{self._who()}: detached after falling {self.slots} epochs behind a faster "
                                   f"consumer (it held epoch {self.epoch}); attach again to continue from newer data")
        state = int(h[_F_STATE])
        if state == _CLOSED:
            raise LoaderClosed(f"{self._who()}: the producer closed the loader")
        if state == _FAILED:
            raise ProducerLost(f"{self._who()}: the producer failed: {self._seg.error()}")
        pid = int(h[_F_PID])
        if not _pid_alive(pid):
            with contextlib.suppress(OSError, LoaderError), _locked(self.loader):
                if int(h[_F_STATE]) != _CLOSED:
                    _segment(self.loader).unlink(missing_ok=True)  # nobody else will
                    _lock_path(self.loader).unlink(missing_ok=True)
            raise ProducerLost(f"{self._who()}: the producer process {pid} is gone")
        age = (time.monotonic_ns() - int(h[_F_BEAT])) / 1e9
        if age > self.producer_timeout:
            raise ProducerLost(f"{self._who()}: no heartbeat from producer pid {pid} for {age:.1f} s "
                               f"(limit {self.producer_timeout:g} s)")

    def get(self, epoch: int) -> dict[str, np.ndarray]:
        """Hold epoch ``epoch`` (releasing the one held before) and return its arrays as views of the segment.

        The views stay valid while this consumer holds the epoch; :meth:`check` (or :meth:`rows`)
        tells whether they still are.

        Raises
        ------
        ConfigError
            If ``epoch`` is not an int >= 0.
        ConsumerDetached
            If this consumer was detached, or ``epoch`` was already overwritten.
        ProducerLost, LoaderClosed
            If the producer is gone, silent for ``producer_timeout``, failed or closed.
        DeadlineExceeded
            If the epoch did not arrive within ``wait_timeout`` seconds.
        """
        from carls_dask.errors import DeadlineExceeded

        e = _positive(f"{self._who()}: epoch", epoch, minimum=0)
        self._check()
        seg = self._seg
        slot = e % seg.layout.slots
        limit = int(seg.header[_F_LIMIT])
        if 0 <= limit <= e:
            raise LoaderError(f"{self._who()}: epoch {e} asked for; the loader produces epochs 0 to {limit - 1}")
        with _locked(self.loader, check=self._check):
            if int(seg.table[self._row, 0]) == _DETACHED:
                self._check()
            if e < int(seg.header[_F_PRODUCED]) and int(seg.slot_epoch[slot]) != e:
                raise ConsumerDetached(f"{self._who()}: epoch {e} was overwritten; the ring holds the "
                                       f"{seg.layout.slots} newest of epochs 0 to {int(seg.header[_F_PRODUCED]) - 1}")
            seg.table[self._row, 2] = e
            seg.table[self._row, 3] = e
            seg.header[_F_HIGH] = max(int(seg.header[_F_HIGH]), e)
            self.epoch = e
        deadline = time.monotonic() + self.wait_timeout
        wait = _POLL
        while not (int(seg.slot_epoch[slot]) == e and int(seg.slot_writing[slot]) == 0):
            self._check()
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"{self._who()}: epoch {e} not produced within {self.wait_timeout:g} s")
            time.sleep(wait)
            wait = min(wait * 2, _POLL_MAX)
        return seg.slots[slot]

    def peers(self) -> list[dict[str, int]]:
        """The consumers attached now: ``pid``, the epoch each holds (``-1``: none) and the one it waits for."""
        self._open()
        t = self._seg.table
        return [{"pid": int(r[1]), "epoch": int(r[2]), "wanted": int(r[3])} for r in t if r[0] == _ACTIVE]

    def valid(self) -> bool:
        """Whether the views of the held epoch are still intact (not detached, slot not overwritten)."""
        if self.epoch is None or not len(self._seg.header):
            return False
        slot = self.epoch % self._seg.layout.slots
        return (int(self._seg.table[self._row, 0]) == _ACTIVE and int(self._seg.slot_epoch[slot]) == self.epoch
                and int(self._seg.slot_writing[slot]) == 0)

    def check(self) -> None:
        """Raise :class:`ConsumerDetached` if the held epoch's views were overwritten, else return."""
        if not self.valid():
            self._check()
            raise ConsumerDetached(f"{self._who()}: epoch {self.epoch} is no longer held")

    def rows(self, array: str, index: Any) -> np.ndarray:
        """A copy of ``array[index]`` of the held epoch, checked intact after copying."""
        if self.epoch is None:
            raise LoaderError(f"{self._who()}: rows() before get(); expected an epoch to be held")
        views = self._seg.slots[self.epoch % self._seg.layout.slots]
        if array not in views:
            raise ConfigError(f"{self._who()}: no epoch array {array!r}; expected one of {sorted(views)}")
        out = views[array][index].copy()
        self.check()
        return out

    def release(self) -> None:
        """Hold no epoch (the producer may overwrite it); the next :meth:`get` holds one again."""
        self._open()
        with _locked(self.loader, check=self._check):
            self._seg.table[self._row, 2] = -1
            self._seg.table[self._row, 3] = -1
        self.epoch = None

    def close(self) -> None:
        """Leave the loader (idempotent); views taken from it must not be used afterwards."""
        if not len(self._seg.header):
            return
        with contextlib.suppress(OSError, LoaderError), _locked(self.loader):
            if int(self._seg.table[self._row, 1]) == os.getpid():
                self._seg.table[self._row] = (_FREE, 0, -1, -1)
        self._seg.close()
        self.epoch = None

    def __enter__(self) -> LoaderConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach(name: str, consumer: str = "consumer", *, expect: Mapping[str, Any] | None = None,
           wait_timeout: float = 60.0, producer_timeout: float = 30.0) -> LoaderConsumer:
    """Attach to the shared loader ``name`` on this node as a consumer.

    Parameters
    ----------
    name
        The loader's name.
    consumer
        This consumer's name, used in errors and logs.
    expect
        ``{array: (shape, dtype)}`` the caller relies on, static or per-epoch; a mismatch is an error.
    wait_timeout
        Deadline of one :meth:`LoaderConsumer.get` (seconds).
    producer_timeout
        A producer whose heartbeat is older than this is lost (seconds); it must exceed the time
        the producer's transform takes for one epoch.

    Raises
    ------
    ConfigError
        On a bad name, timeouts or ``expect``.
    LoaderError
        If no loader of that name exists, it has no room for another consumer, or ``expect`` does
        not match its arrays (nothing is registered).
    ProducerLost, LoaderClosed
        If its producer is gone, failed or closed.
    """
    _check_name(name)
    wait_timeout = _seconds(f"attach({name!r}): wait_timeout", wait_timeout)
    producer_timeout = _seconds(f"attach({name!r}): producer_timeout", producer_timeout)
    if not isinstance(consumer, str) or not consumer:
        raise ConfigError(f"attach({name!r}): consumer={consumer!r}; expected a non-empty name")
    wanted = {str(k): ArraySpec.of(f"attach({name!r}): expect[{k!r}]", v) for k, v in (expect or {}).items()}
    if not _segment(name).exists():
        raise LoaderError(f"shared loader {name!r}: no segment {_segment(name)} on this node; "
                          "expected a producer to have created it (SharedLoader)")
    with _locked(name):
        seg = _map(name)
    try:
        have = {**seg.layout.static, **seg.layout.epoch}
        for k, spec in wanted.items():
            got = have.get(k)
            if got is None:
                raise LoaderError(f"shared loader {name!r}: no array {k!r}; it holds {sorted(have)}")
            if got.shape != spec.shape or np.dtype(got.dtype) != np.dtype(spec.dtype):
                raise LoaderError(f"shared loader {name!r}: array {k!r} is {np.dtype(got.dtype)}{list(got.shape)}; "
                                  f"expected {np.dtype(spec.dtype)}{list(spec.shape)}")
        out = LoaderConsumer(seg, consumer, -1, wait_timeout, producer_timeout)
        deadline = time.monotonic() + wait_timeout
        while int(seg.header[_F_STATE]) == _STARTING:  # the producer is still writing the static arrays
            out._check()
            if time.monotonic() > deadline:
                from carls_dask.errors import DeadlineExceeded

                raise DeadlineExceeded(f"shared loader {name!r}: still starting after {wait_timeout:g} s")
            time.sleep(_POLL)
        out._check()
        with _locked(name):
            # a free row, or a detached one whose process is gone, can be reused
            free = [int(r) for r in np.flatnonzero(seg.table[:, 0] != _ACTIVE)
                    if seg.table[r, 0] == _FREE or not _pid_alive(int(seg.table[r, 1]))]
            if not free:
                raise LoaderError(f"shared loader {name!r}: all {seg.layout.consumers} consumer places are taken; "
                                  "expected a loader created with more consumers")
            out._row = free[0]
            seg.table[out._row] = (_ACTIVE, os.getpid(), -1, -1)
    except BaseException:
        seg.close()
        raise
    logger.debug("shared loader %r: consumer %r attached", name, consumer)
    return out
