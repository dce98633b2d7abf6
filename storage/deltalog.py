"""The append-only delta log between snapshots: every acknowledged bank update is durable.

Each shard appends to its own folder ``ROOT/delta/shard-NNNN/``, in segment files
``seg-<first seq>.log`` that roll over at a size limit (the log's chunks). A record is one frame::

    b"CDL1" | header length u32 | payload length u64 | crc32 u32 | JSON header | raw array bytes

The header names the sequence number, step, table, op and each array's dtype and shape; the payload is
the arrays' bytes back to back. Nothing is pickled. :meth:`DeltaLog.append` returns once the frame is in
the operating system (a killed process loses nothing) and, with ``sync`` (the ``every-write`` durability),
``fdatasync``-ed, so an acknowledged update survives a machine crash too; without it, frames are synced
together by a group syncer (group commit, see :class:`DeltaLog`). A frame torn by a crash
fails its length or CRC check; it can only be the last one, and readers stop before it (the next writer
truncates it). Why not Zarr here: a durable Zarr append per update would write and fsync several files
(chunk + metadata) each time; one frame in one file is one write and one sync.

Only one writer per shard: a ``flock`` on ``writer.lock``; a second writer gets
:class:`~carls_dask.errors.StoreLockedError`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import logging
import os
import pathlib
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from carls_dask.errors import (
    CorruptStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreNotFoundError,
)
from carls_dask.storage.fsutil import WriterLock, check_reserve, fsync_dir
from carls_dask.storage.manifest import delta_seqs, read_manifest

__all__ = [
    "DeltaLog",
    "DeltaRecord",
    "log_bytes",
    "prune_segments",
    "pruned_after",
    "replay",
    "shards_in",
]

logger = logging.getLogger(__name__)

MAGIC = b"CDL1"
_FRAME = struct.Struct("<4sIQI")
_SEG_RE = re.compile(r"^seg-(\d{12})\.log$")
OPS = ("upsert", "delete")
DELTA = "delta"


@dataclasses.dataclass(frozen=True)
class DeltaRecord:
    """One replayed delta-log record.

    Attributes
    ----------
    shard, seq : int
        The writing shard and the record's sequence number in that shard's log (1, 2, ...).
    step : int
        The step passed to :meth:`DeltaLog.append`.
    table, op : str
        Table name; ``"upsert"`` (full rows after the update) or ``"delete"`` (keys).
    wall_time : float
        Unix time of the append.
    arrays : dict of str to ndarray
        The record's arrays, row-aligned (``keys`` always present).
    """

    shard: int
    seq: int
    step: int
    table: str
    op: str
    wall_time: float
    arrays: dict[str, np.ndarray]


def _shard_dir(root: str | os.PathLike[str], shard: int) -> pathlib.Path:
    return pathlib.Path(root) / DELTA / f"shard-{int(shard):04d}"


def _segments(d: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    if not d.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _SEG_RE.match(p.name)))


def _scan(path: pathlib.Path, *, read_arrays: bool) -> Iterator[tuple[int, dict[str, Any], dict[str, np.ndarray]]]:
    """Yield ``(end offset, header, arrays)`` per complete frame; stop at the first torn or bad frame.

    Stopping (rather than raising) is right for the newest segment, whose tail may be mid-write; callers
    check older segments end exactly where the file ends.
    """
    with open(path, "rb") as fh:
        pos = 0
        size = os.fstat(fh.fileno()).st_size
        while pos + _FRAME.size <= size:
            head = fh.read(_FRAME.size)
            magic, hlen, plen, crc = _FRAME.unpack(head)
            end = pos + _FRAME.size + hlen + plen
            if magic != MAGIC or end > size:
                return
            hbytes = fh.read(hlen)
            payload = bytearray(plen)
            fh.readinto(payload)
            if zlib.crc32(payload, zlib.crc32(hbytes)) != crc:
                return
            header, arrays = _decode(path, pos, hbytes, payload, read_arrays)
            yield end, header, arrays
            pos = end


def _decode(path: pathlib.Path, pos: int, hbytes: bytes, payload: bytearray,
            read_arrays: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of a frame whose CRC matched; numeric arrays only, never anything else.

    A frame that passes its CRC but does not decode was not written by :meth:`DeltaLog.append`.
    """
    try:
        header = json.loads(hbytes)
        if not isinstance(header, dict):
            raise TypeError(f"header is a JSON {type(header).__name__}")
        int(header["seq"])
        arrays: dict[str, np.ndarray] = {}
        for name, dtype, shape, off, nbytes in header["arrays"]:
            dt = np.dtype(str(dtype))
            if dt.kind not in "biuf":
                raise TypeError(f"array {name!r} has dtype {dt}")
            count = int(np.prod([int(d) for d in shape], dtype=np.int64))
            if count * dt.itemsize != nbytes or not 0 <= int(off) <= len(payload) - nbytes:
                raise ValueError(f"array {name!r}: {count} x {dt} at byte {off} does not fit {nbytes} bytes "
                                 f"of a {len(payload)}-byte payload")
            if read_arrays:
                a = np.frombuffer(payload, dtype=dt, count=count, offset=int(off))
                arrays[str(name)] = a.reshape([int(d) for d in shape])
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptStoreError(f"delta log {path}: the record at byte {pos} does not decode ({exc}); expected "
                                "a JSON header and numeric arrays as DeltaLog.append writes them") from None
    return header, arrays


def _last_valid(path: pathlib.Path) -> tuple[int, int | None]:
    """End offset of the last complete frame and its seq (None if the segment has no complete frame)."""
    end, seq = 0, None
    for e, header, _ in _scan(path, read_arrays=False):
        end, seq = e, int(header["seq"])
    return end, seq


class DeltaLog:
    """The single writer of one shard's delta log.

    Durability: :meth:`append` hands each frame to the operating system (``write`` then ``flush``) before it
    returns, so a killed process loses no appended frame; whether it is also on disk when ``append`` returns
    depends on ``sync``:

    - ``sync=True`` (``every-write``): ``append`` returns after an ``fdatasync`` that covers the frame (and
      every frame written before it).
    - ``sync=False`` with ``group_interval`` (``group``, group commit): a background thread ``fdatasync``-s
      every ``group_interval`` seconds while frames wait, and the appender syncs at once when
      ``group_bytes`` are waiting; one sync covers every waiting frame, and :meth:`flush` (a writer that
      must know its frames are on disk) waits for the next sync, one sync serving every such waiter. A
      machine or kernel crash loses at most the frames of the open window (at most ``group_bytes``, written
      within ``group_interval`` plus one sync's time); a process crash loses nothing.
    - ``sync=False`` without ``group_interval``: no sync until :meth:`flush` or :meth:`close` (throw-away banks).

    Parameters
    ----------
    root : path-like
        The bank store folder (``RUN/bank``); the log lives in ``root/delta/shard-NNNN``.
    shard : int
        The shard id.
    segment_bytes : int
        Size at which the writer starts a new segment file.
    sync : bool
        The default of :meth:`append`'s ``sync``: ``fdatasync`` before each append returns.
    group_interval : float, optional
        Seconds between the group syncs of frames appended with ``sync=False`` (None: no background sync).
    group_bytes : int
        Unsynced bytes at which an appender syncs at once (with ``group_interval``).
    reserve : int
        Free bytes the log's disk must keep: an append that would leave less is refused before anything is
        written (:class:`~carls_dask.errors.DiskReserveError`); 0 checks nothing.

    Raises
    ------
    StoreLockedError
        If another writer (any process) holds this shard's log.
    """

    def __init__(
        self, root: str | os.PathLike[str], shard: int, *, segment_bytes: int = 64 << 20, sync: bool = True,
        group_interval: float | None = None, group_bytes: int = 8 << 20, reserve: int = 0,
    ) -> None:
        if group_interval is not None and not float(group_interval) > 0:
            raise InvalidBatchError(f"delta log of shard {shard}: group_interval={group_interval!r}; expected seconds > 0")
        self.root = pathlib.Path(root)
        self.shard = int(shard)
        self.segment_bytes = int(segment_bytes)
        self.sync = bool(sync)
        self.group_interval = None if group_interval is None else float(group_interval)
        self.group_bytes = int(group_bytes)
        self.reserve = int(reserve)
        self.dir = _shard_dir(root, shard)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.dir / "writer.lock", f"delta log of shard {shard} in {self.root}")
        self._fh: Any = None
        segs = _segments(self.dir)
        self.seq = 0
        if segs:
            first, path = segs[-1]
            end, seq = _last_valid(path)
            self.seq = seq if seq is not None else first - 1
            if end < path.stat().st_size:  # torn tail of a crashed writer: never acknowledged
                logger.warning("delta log %s: dropping %d torn bytes at its end", path, path.stat().st_size - end)
                with open(path, "r+b") as fh:
                    fh.truncate(end)
                    os.fsync(fh.fileno())
            if end < self.segment_bytes:
                self._fh = open(path, "ab")  # held open across appends; closed in close()
        # group commit: what was written and what a completed fdatasync covers
        self._cv = threading.Condition(threading.Lock())
        self._durable = self.seq
        self._syncing = False
        self._unsynced_bytes = 0
        self._unsynced_since: float | None = None
        self._syncer: threading.Thread | None = None
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        #: Frames and bytes appended, and ``fdatasync`` calls made, by this writer.
        self.frames = 0
        self.bytes = 0
        self.syncs = 0
        #: The most bytes that waited for a sync at once, and the longest a frame waited (seconds).
        self.max_unsynced_bytes = 0
        self.max_unsynced_s = 0.0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return not self._lock.held

    @property
    def durable_seq(self) -> int:
        """The newest sequence number an ``fdatasync`` has covered (every frame up to it is on disk)."""
        return self._durable

    def _open_segment(self) -> None:
        path = self.dir / f"seg-{self.seq + 1:012d}.log"
        self._fh = open(path, "ab")  # held open across appends; closed in close()
        fsync_dir(self.dir)

    def roll(self, *, reopen: bool = False) -> None:
        """Close the current segment (after syncing what waits in it); the next append starts a new one.

        ``reopen`` starts the new (empty) segment at once, so that every older segment can be pruned while
        the log's sequence numbers still continue from its name (done right after a snapshot).
        """
        self.flush()
        with self._cv:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            if reopen:
                self._open_segment()

    def _frame(self, step: int, table: str, op: str, arrays: Mapping[str, np.ndarray]) -> tuple[bytes, list[np.ndarray]]:
        """The header bytes (frame head + JSON) and the array buffers of one record, validated."""
        what = f"delta log of shard {self.shard} in {self.root}, table {table!r}"
        if op not in OPS:
            raise InvalidBatchError(f"{what}: op {op!r}; expected one of {OPS}")
        if "keys" not in arrays:
            raise InvalidBatchError(f"{what}: arrays {sorted(arrays)} lack 'keys'; expected int64 keys")
        keys = np.asarray(arrays["keys"])
        if keys.ndim != 1 or keys.dtype != np.int64:
            raise InvalidBatchError(f"{what}: keys {keys.dtype}{keys.shape}; expected int64[n]")
        n = keys.shape[0]
        bufs: list[np.ndarray] = []
        spec = []
        off = 0
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            if a.dtype.kind not in "biuf":
                raise InvalidBatchError(f"{what}: array {name!r} has dtype {a.dtype}; expected a numeric dtype")
            if a.ndim == 0 or a.shape[0] != n:
                raise InvalidShapeError(f"{what}: array {name!r} has shape {a.shape}; expected {n} rows like 'keys'")
            spec.append([name, a.dtype.str, list(a.shape), off, a.nbytes])
            off += a.nbytes
            bufs.append(a)
        header = json.dumps(
            {"seq": self.seq + 1, "step": int(step), "table": table, "op": op, "wall_time": time.time(),
             "arrays": spec}
        ).encode()
        crc = zlib.crc32(header)
        for a in bufs:
            crc = zlib.crc32(a.data.cast("B"), crc)
        return _FRAME.pack(MAGIC, len(header), off, crc) + header, bufs

    def append(self, step: int, table: str, op: str, arrays: Mapping[str, np.ndarray], *,
               sync: bool | None = None) -> int:
        """Append one record; return its sequence number.

        Parameters
        ----------
        step : int
            The bank/training step of the update (``open_bank(step=...)`` filters on it).
        table : str
            Table name.
        op : {"upsert", "delete"}
            ``"upsert"`` carries the full rows after the update (``keys``, ``bucket``, ``frequency``,
            ``prov/*``, ``col/*``, ``slot/*/*``); ``"delete"`` carries ``keys`` (and ``bucket``).
            Include ``bucket`` so restores onto another shard count can route rows without rehashing.
        arrays : dict of str to ndarray
            Row-aligned numeric arrays.
        sync : bool, optional
            Return only once the record is on disk (``fdatasync``); default the log's ``sync``. Without it the
            record is in the operating system when this returns and on disk at the next group sync.

        Raises
        ------
        DiskReserveError
            If the record would take the disk below ``reserve`` (nothing is written).
        """
        if self.closed:
            raise LifecycleError(f"delta log of shard {self.shard} in {self.root}: closed; expected an open log")
        if self._failed is not None:
            raise LifecycleError(f"delta log of shard {self.shard} in {self.root}: a group sync failed "
                                 f"({self._failed!r}); expected a log whose syncs succeed") from self._failed
        head, bufs = self._frame(step, table, op, arrays)
        nbytes = len(head) + sum(a.nbytes for a in bufs)
        check_reserve(self.dir, nbytes, self.reserve, f"delta log of shard {self.shard} in {self.root}")
        with self._cv:
            if self._fh is None:
                self._open_segment()
            fh = self._fh
            fh.write(head)
            for a in bufs:
                fh.write(a.data.cast("B"))
            fh.flush()  # in the operating system now: a killed process loses nothing
            self.seq += 1
            seq = self.seq
            self.frames += 1
            self.bytes += nbytes
            self._unsynced_bytes += nbytes
            if self._unsynced_since is None:
                self._unsynced_since = time.monotonic()
            self.max_unsynced_bytes = max(self.max_unsynced_bytes, self._unsynced_bytes)
            full = fh.tell() >= self.segment_bytes
            crowded = self._unsynced_bytes >= self.group_bytes
        if self.sync if sync is None else sync:
            self.flush()
        elif self.group_interval is not None:
            if crowded:
                self.flush()
            elif self._syncer is None:
                self._start_syncer()
        if full:
            self.roll()
        return seq

    def flush(self) -> int:
        """Make every frame appended so far durable (one ``fdatasync``); returns :attr:`durable_seq`.

        Group commit: a caller that finds a sync in progress waits for it and syncs again only if that one did
        not cover its frames, so one ``fdatasync`` serves every writer waiting on it.
        """
        with self._cv:
            target = self.seq
            while self._durable < target:
                if self._syncing:
                    self._cv.wait()
                    continue
                self._syncing = True
                upto, since = self.seq, self._unsynced_since
                fd = os.dup(self._fh.fileno()) if self._fh is not None else None
                self._unsynced_bytes = 0
                self._unsynced_since = None
                self._cv.release()
                try:
                    if fd is not None:
                        os.fdatasync(fd)
                finally:
                    if fd is not None:
                        os.close(fd)
                    self._cv.acquire()
                    self._syncing = False
                    self._cv.notify_all()
                self.syncs += int(fd is not None)
                self._durable = max(self._durable, upto)
                if since is not None:
                    self.max_unsynced_s = max(self.max_unsynced_s, time.monotonic() - since)
            return self._durable

    def _start_syncer(self) -> None:
        self._syncer = threading.Thread(target=self._sync_loop, name=f"carls-deltalog-{self.shard}-sync", daemon=True)
        self._syncer.start()

    def _sync_loop(self) -> None:
        """The group syncer: every ``group_interval`` seconds, one ``fdatasync`` for the frames waiting."""
        assert self.group_interval is not None
        while not self._stop.wait(self.group_interval):
            if self._durable < self.seq:
                try:
                    self.flush()
                except BaseException as exc:  # the next append raises it: a log that cannot sync takes no writes
                    self._failed = exc
                    logger.error("delta log of shard %d in %s: group sync failed: %r", self.shard, self.root, exc)
                    return

    def stats(self) -> dict[str, Any]:
        """What this writer appended and synced: ``seq``, ``durable_seq``, ``frames``, ``bytes``, ``syncs``,
        ``unsynced_bytes`` (waiting now), ``max_unsynced_bytes`` and ``max_unsynced_s`` (the window)."""
        with self._cv:
            return {"seq": self.seq, "durable_seq": self._durable, "frames": self.frames, "bytes": self.bytes,
                    "syncs": self.syncs, "unsynced_bytes": self._unsynced_bytes,
                    "max_unsynced_bytes": self.max_unsynced_bytes, "max_unsynced_s": self.max_unsynced_s}

    def close(self) -> None:
        """Stop the group syncer, sync what waits, close the segment and release the writer lock (idempotent)."""
        if self.closed:
            return
        self._stop.set()
        if self._syncer is not None and self._syncer is not threading.current_thread():
            self._syncer.join(timeout=30)
        try:
            self.roll()
        finally:
            self._lock.release()

    def __enter__(self) -> DeltaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net only
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass


def shards_in(root: str | os.PathLike[str]) -> list[int]:
    """Shard ids that have a delta log under ``root``."""
    d = pathlib.Path(root) / DELTA
    if not d.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in d.iterdir() if p.name.startswith("shard-"))


def replay(
    root: str | os.PathLike[str],
    *,
    shards: list[int] | None = None,
    since_seq: Mapping[int, int] | int | None = None,
    since_version: int | None = None,
    until_step: int | None = None,
    tables: list[str] | None = None,
) -> Iterator[DeltaRecord]:
    """Yield delta records in order: per shard by sequence, shards merged by append time.

    Parameters
    ----------
    root : path-like
        The bank store.
    shards : list of int, optional
        Only these shards' logs (default: all present).
    since_seq : int or dict of shard to int, optional
        Only records with a larger sequence number (per shard when a dict).
    since_version : int, optional
        Only records newer than that committed snapshot (its shards' ``delta_seq``).
    until_step : int, optional
        Only records with ``step <= until_step``.
    tables : list of str, optional
        Only these tables.

    Raises
    ------
    CorruptStoreError
        If a record in the middle of a log is damaged (only the newest record can be torn).
    StoreNotFoundError
        If ``since_seq`` or ``since_version`` asks for records a newer snapshot's truncation removed
        (:func:`pruned_after`).
    """
    base: dict[int, int] = {}
    if since_version is not None:
        base = delta_seqs(read_manifest(root, since_version))
    elif isinstance(since_seq, Mapping):
        base = {int(k): int(v) for k, v in since_seq.items()}
    default = since_seq if isinstance(since_seq, int) else 0
    if since_seq is not None or since_version is not None:
        gone = pruned_after(root, base or {s: default for s in shards_in(root)}, shards)
        if gone:
            raise StoreNotFoundError(
                f"delta log of {root}: the records after {gone} were removed when a newer snapshot truncated the log "
                "(carls.storage.log-history); expected a replay from the newest snapshot, or from a step a kept "
                "snapshot holds")
    per_shard: list[list[DeltaRecord]] = []
    for shard in shards if shards is not None else shards_in(root):
        after = base.get(shard, default)
        segs = _segments(_shard_dir(root, shard))
        records: list[DeltaRecord] = []
        per_shard.append(records)
        for i, (first, path) in enumerate(segs):
            nxt = segs[i + 1][0] if i + 1 < len(segs) else None
            if nxt is not None and nxt - 1 <= after:
                continue  # every record of this segment is at or before `after`
            end = 0
            expect = first
            for frame_end, header, arrays in _scan(path, read_arrays=True):
                end = frame_end
                seq = int(header["seq"])
                if seq != expect:
                    raise CorruptStoreError(f"delta log {path}: record {seq} follows {expect - 1}; expected {expect}")
                expect += 1
                if seq <= after or (until_step is not None and header["step"] > until_step):
                    continue
                if tables is not None and header["table"] not in tables:
                    continue
                records.append(
                    DeltaRecord(shard, seq, int(header["step"]), header["table"], header["op"],
                                float(header["wall_time"]), arrays)
                )
            if nxt is not None and end != path.stat().st_size:
                raise CorruptStoreError(
                    f"delta log {path}: damaged record at byte {end} of {path.stat().st_size}; "
                    "expected only the newest segment to end early"
                )
    # each shard's records stay in seq order; shards interleave by append time
    yield from heapq.merge(*per_shard, key=lambda r: r.wall_time)


def pruned_after(root: str | os.PathLike[str], since: Mapping[int, int],
                 shards: list[int] | None = None) -> dict[int, int]:
    """Shards whose log no longer holds every record after ``since[shard]``: ``{shard: since}`` (empty when whole).

    A snapshot that truncates the log (:func:`prune_segments`) removes the segments it covers; a replay from an
    older snapshot then misses records, which this tells before anything is read.
    """
    out: dict[int, int] = {}
    for shard in shards if shards is not None else shards_in(root):
        segs = _segments(_shard_dir(root, shard))
        after = int(since.get(shard, 0))
        if segs and segs[0][0] > after + 1:
            out[shard] = after
    return out


def log_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of every shard's delta-log segments under ``root``."""
    total = 0
    for shard in shards_in(root):
        for _, path in _segments(_shard_dir(root, shard)):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # pruned meanwhile
                pass
    return total


def prune_segments(root: str | os.PathLike[str], covered: Mapping[int, int]) -> list[pathlib.Path]:
    """Remove segments whose records all have ``seq <= covered[shard]``; never a shard's newest segment."""
    removed = []
    for shard, upto in covered.items():
        segs = _segments(_shard_dir(root, shard))
        for (_first, path), (nxt, _) in itertools.pairwise(segs):
            if nxt - 1 <= upto:
                path.unlink()
                removed.append(path)
        if removed:
            fsync_dir(_shard_dir(root, shard))
    return removed
