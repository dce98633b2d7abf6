"""The append-only delta log between snapshots: every acknowledged bank update is durable.

Each shard appends to its own folder ``ROOT/delta/shard-NNNN/``, in segment files
``seg-<first seq>.log`` that roll over at a size limit (the log's chunks). A record is one frame::

    b"CDL1" | header length u32 | payload length u64 | crc32 u32 | JSON header | raw array bytes

The header names the sequence number, step, table, op and each array's dtype and shape; the payload is
the arrays' bytes back to back. Nothing is pickled. :meth:`DeltaLog.append` returns only after the frame
is written and ``fdatasync``-ed, so an acknowledged update survives a crash. A frame torn by a crash
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
import time
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from carls_dask.errors import CorruptStoreError, InvalidBatchError, InvalidShapeError, LifecycleError
from carls_dask.storage.fsutil import WriterLock, fsync_dir
from carls_dask.storage.manifest import delta_seqs, read_manifest

__all__ = [
    "DeltaLog",
    "DeltaRecord",
    "prune_segments",
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
            raise CorruptStoreError(f"header is a JSON {type(header).__name__}")
        int(header["seq"])
        arrays: dict[str, np.ndarray] = {}
        for name, dtype, shape, off, nbytes in header["arrays"]:
            dt = np.dtype(str(dtype))
            if dt.kind not in "biuf":
                raise CorruptStoreError(f"array {name!r} has dtype {dt}")
            count = int(np.prod([int(d) for d in shape], dtype=np.int64))
            if count * dt.itemsize != nbytes or not 0 <= int(off) <= len(payload) - nbytes:
                raise CorruptStoreError(f"array {name!r}: {count} x {dt} at byte {off} does not fit {nbytes} bytes "
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

    Parameters
    ----------
    root : path-like
        The bank store folder (``RUN/bank``); the log lives in ``root/delta/shard-NNNN``.
    shard : int
        The shard id.
    segment_bytes : int
        Size at which the writer starts a new segment file.
    sync : bool
        ``fdatasync`` after every append (the durability guarantee); turn off only for throw-away banks.

    Raises
    ------
    StoreLockedError
        If another writer (any process) holds this shard's log.
    """

    def __init__(
        self, root: str | os.PathLike[str], shard: int, *, segment_bytes: int = 64 << 20, sync: bool = True
    ) -> None:
        self.root = pathlib.Path(root)
        self.shard = int(shard)
        self.segment_bytes = int(segment_bytes)
        self.sync = bool(sync)
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return not self._lock.held

    def _open_segment(self) -> None:
        path = self.dir / f"seg-{self.seq + 1:012d}.log"
        self._fh = open(path, "ab")  # held open across appends; closed in close()
        fsync_dir(self.dir)

    def roll(self) -> None:
        """Close the current segment; the next append starts a new one (e.g. right after a snapshot)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def append(self, step: int, table: str, op: str, arrays: Mapping[str, np.ndarray]) -> int:
        """Append one record and make it durable; return its sequence number.

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
        """
        if self.closed:
            raise LifecycleError(f"delta log of shard {self.shard} in {self.root}: closed; expected an open log")
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
        seq = self.seq + 1
        header = json.dumps(
            {"seq": seq, "step": int(step), "table": table, "op": op, "wall_time": time.time(), "arrays": spec}
        ).encode()
        crc = zlib.crc32(header)
        for a in bufs:
            crc = zlib.crc32(a.data.cast("B"), crc)
        if self._fh is None:
            self._open_segment()
        fh = self._fh
        fh.write(_FRAME.pack(MAGIC, len(header), off, crc))
        fh.write(header)
        for a in bufs:
            fh.write(a.data.cast("B"))
        fh.flush()
        if self.sync:
            os.fdatasync(fh.fileno())
        self.seq = seq
        if fh.tell() >= self.segment_bytes:
            self.roll()
        return seq

    def close(self) -> None:
        """Close the segment and release the writer lock (idempotent)."""
        self.roll()
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
    """
    base: dict[int, int] = {}
    if since_version is not None:
        base = delta_seqs(read_manifest(root, since_version))
    elif isinstance(since_seq, Mapping):
        base = {int(k): int(v) for k, v in since_seq.items()}
    default = since_seq if isinstance(since_seq, int) else 0
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
