"""Versioned bank snapshots in Zarr v3, laid out by hash bucket and committed atomically.

Layout of a bank store (``RUN/bank/``)::

    manifest.json                  committed snapshots, newest last (replaced atomically: the commit point)
    snapshots/v000007/
        shard-0000.zarr/           one Zarr v3 group per shard: <table>/keys, <table>/bucket,
                                   <table>/bucket_offsets, <table>/frequency, <table>/prov/<field>,
                                   <table>/col/<column>, <table>/slot/<column>/<slot>
        shard-0000.json            written (atomically) once that shard's arrays are on disk
        snapshot.json              the version's manifest, written at commit
    delta/shard-0000/...           the delta log (see :mod:`carls_dask.storage.deltalog`)

Inside a shard's arrays the rows are sorted by bucket, and ``bucket_offsets[b]:bucket_offsets[b + 1]``
are the rows of bucket ``b``, so a restore onto another shard count reads only the chunks that hold the
buckets a new shard owns.

A snapshot is written in three steps: :func:`begin_snapshot` makes a new version folder,
:func:`write_shard` (once per shard, possibly in other processes) writes whole chunks and fsyncs them, and
:func:`commit_snapshot` writes ``snapshot.json`` and then swaps ``manifest.json``. A process killed before
the swap leaves the previous snapshot listed, complete and untouched.

**Incremental snapshots.** A version begun with ``parent=P`` (:func:`begin_snapshot`) may hold, per shard,
only what changed since ``P``: the rows upserted since (full rows, in the same arrays as a full snapshot)
plus ``<table>/deleted_keys`` and ``<table>/deleted_bucket`` (keys deleted since and absent now). Such a
shard's entry names its ``parent``; a shard with nothing to build on writes in full in the same version. At
commit, the root manifest's entry records ``parent``, ``depends`` (every version needed to read it, down to
the full snapshots), ``chain`` (increments since the last full one) and ``changed_rows`` (rows those
increments hold), which :func:`carls_dask.storage.bankstore.next_parent` uses to make every N-th snapshot
(or one whose increments grew past a fraction of the bank) full again: compaction. A restore folds a
shard's chain oldest first (base rows, then each increment's deletes and upserts:
:class:`carls_dask.storage.bankstore.BankReplay`); :func:`prune_versions` never drops a version a kept
one depends on. :func:`read_snapshot` reads one version's stored rows only (for an increment, its changes).

**No whole-state copy.** :func:`write_shard` gathers each array's rows into bucket order one chunk at a
time (:func:`carls_dask.storage.chunkio.write_chunks`), so it can be handed views of a live shard's rows
(``ShardCore.state_view``, or :class:`carls_dask.bank.rowview.RowView` for segmented storage read with
``a[rows]``) instead of a copy. The memory a full snapshot adds is one chunk per writer thread plus the
bucket order (8 bytes a row). Consistency is the caller's: the bank shard holds its lock for the whole
write (``BankShard.snapshot``), so a snapshot is the shard's state at one point, after every acknowledged
batch before it and before every later one. That blocks the shard's writes (and waits its reads) for the
write's duration, as the earlier copy-then-write did for the copy and the write; copy-on-write would
shorten it, at the price of a second copy of every row written meanwhile, and is not done.

The manifests are read and checked by :mod:`carls_dask.storage.manifest` (``list_snapshots`` and
``read_manifest`` are re-exported here); uncompressed chunks are written and read by
:mod:`carls_dask.storage.chunkio`. This module knows nothing of the delta log: a snapshot records, per
shard, the log sequence number its writer passes (``delta_seq``), and
:mod:`carls_dask.storage.bankstore` composes snapshots with the log (restore, replay, pruning of both).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from carls_dask.errors import (
    CorruptStoreError,
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreLockedError,
    StoreNotFoundError,
)
from carls_dask.storage.chunkio import (
    check_chunks,
    open_checked,
    plain_codecs,
    read_rows,
    scratch,
    write_chunks,
)
from carls_dask.storage.fsutil import (
    WriterLock,
    atomic_write_json,
    fsync_dir,
    fsync_tree,
    read_json,
    short_lock,
)
from carls_dask.storage.manifest import (
    FORMAT,
    KIND,
    MANIFEST,
    SNAPSHOTS,
    VERSION_RE,
    list_snapshots,
    load_root_manifest,
    read_manifest,
    shard_name,
    version_name,
)

__all__ = [
    "FORMAT",
    "SnapshotHandle",
    "begin_snapshot",
    "commit_snapshot",
    "list_snapshots",
    "prune_versions",
    "read_deleted",
    "read_manifest",
    "read_snapshot",
    "shard_info",
    "write_shard",
]

logger = logging.getLogger(__name__)

#: Version of the shard-state format (``ShardCore.export_state``) that :func:`write_shard` takes.
STATE_FORMAT = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
#: Threads that write or read a snapshot's arrays concurrently.
IO_THREADS = max(1, min(4, os.cpu_count() or 1))
_REQUIRED = ("keys", "bucket", "frequency", "prov/version", "prov/model_step", "prov/maker", "prov/wall_time")


@dataclasses.dataclass(frozen=True)
class SnapshotHandle:
    """A snapshot being written; picklable, so shard writers in other processes can receive it.

    Attributes
    ----------
    root : str
        The bank store folder.
    version : int
        The version number this snapshot will have once committed.
    step : int
        The training step the snapshot belongs to.
    chunk_rows : int
        Rows per Zarr chunk.
    compressor : str
        ``"none"`` or ``"zstd"``.
    checksum : bool
        Whether each chunk carries a CRC32C checksum that reads verify.
    parent : int or None
        The committed version shards may write an increment on (None: every shard writes its full state).
    """

    root: str
    version: int
    step: int
    chunk_rows: int = 65536
    compressor: str = "none"
    checksum: bool = True
    parent: int | None = None

    @property
    def path(self) -> pathlib.Path:
        """The version folder."""
        return pathlib.Path(self.root) / SNAPSHOTS / version_name(self.version)


def _codecs(compressor: str, checksum: bool) -> list[Any] | None:
    out: list[Any] = []
    if compressor == "zstd":
        out.append(zarr.codecs.ZstdCodec(level=1))
    elif compressor != "none":
        raise InvalidBatchError(f"snapshot compressor: got {compressor!r}; expected 'none' or 'zstd'")
    if checksum:
        out.append(zarr.codecs.Crc32cCodec())
    return out or None


# --------------------------------------------------------------------------------------------- manifest
def begin_snapshot(
    root: str | os.PathLike[str],
    step: int,
    *,
    chunk_rows: int = 65536,
    compressor: str = "none",
    checksum: bool = True,
    parent: int | None = None,
) -> SnapshotHandle:
    """Start a new snapshot: create its version folder (the store too, if new) and return its handle.

    Parameters
    ----------
    root : path-like
        The bank store folder (created if missing).
    step : int
        Training step the snapshot belongs to (``open_bank(step=...)`` uses it).
    chunk_rows : int
        Rows per Zarr chunk (``carls.storage.chunk-rows``).
    compressor : {"none", "zstd"}
        Chunk compressor (``carls.storage.compressor``).
    checksum : bool
        Store a CRC32C per chunk, verified on every read.
    parent : int, optional
        A committed version of this store that shards may write only their changes on
        (:func:`write_shard` with ``deleted``); None: a full snapshot.
    """
    rootp = pathlib.Path(root)
    if int(chunk_rows) < 1:
        raise InvalidBatchError(f"snapshot of {rootp}: chunk_rows={chunk_rows!r}; expected an integer >= 1")
    if parent is not None:
        committed_versions = [e["version"] for e in list_snapshots(rootp)] if rootp.is_dir() else []
        if isinstance(parent, bool) or not isinstance(parent, int | np.integer) or parent not in committed_versions:
            raise InvalidBatchError(f"snapshot of {rootp}: parent={parent!r}; expected a committed version "
                                    f"({committed_versions}) or None")
    _codecs(compressor, checksum)  # validates the compressor name
    rootp.mkdir(parents=True, exist_ok=True)
    load_root_manifest(rootp)  # refuse foreign or newer stores before writing anything
    snapdir = rootp / SNAPSHOTS
    snapdir.mkdir(exist_ok=True)
    while True:
        used = [int(m.group(1)) for p in snapdir.iterdir() if (m := VERSION_RE.match(p.name))]
        committed = [e["version"] for e in list_snapshots(rootp)]
        version = max(used + committed + [0]) + 1
        try:
            (snapdir / version_name(version)).mkdir()
        except FileExistsError:  # another process took this number: take the next one
            continue
        break
    fsync_dir(snapdir)
    handle = SnapshotHandle(str(rootp), version, int(step), int(chunk_rows), compressor, bool(checksum),
                            None if parent is None else int(parent))
    logger.info("snapshot v%d of %s begun at step %d", version, rootp, step)
    return handle


def _validate_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    if not isinstance(state, Mapping) or "meta" not in state or "tables" not in state:
        raise InvalidBatchError(
            f"shard state: got {type(state).__name__} with keys {sorted(state) if isinstance(state, Mapping) else '-'}; "
            "expected a dict with 'meta' and 'tables'"
        )
    meta = dict(state["meta"])
    if meta.get("format") != STATE_FORMAT:
        raise IncompatibleStoreError(
            f"shard state: meta format is {meta.get('format')!r}; expected {STATE_FORMAT}"
        )
    for k in ("shard", "n_shards", "buckets", "owned_buckets"):
        if k not in meta:
            raise InvalidBatchError(f"shard state: meta lacks {k!r}; expected shard, n_shards, buckets, owned_buckets")
    buckets = int(meta["buckets"])
    tables: dict[str, dict[str, np.ndarray]] = {}
    for tname, arrays in state["tables"].items():
        if not _NAME_RE.match(tname):
            raise InvalidBatchError(f"shard state: table name {tname!r}; expected letters, digits, '_', '.', '-'")
        missing = [k for k in _REQUIRED if k not in arrays]
        if missing:
            raise InvalidBatchError(f"shard state table {tname!r}: missing arrays {missing}; expected {list(_REQUIRED)}")
        out: dict[str, np.ndarray] = {}
        keys = arrays["keys"]
        n = int(keys.shape[0]) if _is_row_source(keys) else np.asarray(keys).shape[0]
        for name, arr in arrays.items():
            parts = name.split("/")
            if not all(_NAME_RE.match(p) for p in parts) or (
                len(parts) > 1 and parts[0] not in ("col", "slot", "prov")
            ):
                raise InvalidBatchError(
                    f"shard state table {tname!r}: array name {name!r}; expected keys, bucket, frequency, "
                    "prov/<field>, col/<column> or slot/<column>/<slot>"
                )
            a = arr if _is_row_source(arr) else np.asarray(arr)
            if a.dtype.kind not in "biuf":
                raise InvalidBatchError(
                    f"shard state table {tname!r}, array {name!r}: dtype {a.dtype}; expected a numeric dtype"
                )
            if a.ndim == 0 or a.shape[0] != n:
                raise InvalidShapeError(
                    f"shard state table {tname!r}, array {name!r}: shape {a.shape}; expected {n} rows like 'keys'"
                )
            out[name] = a
        for name in ("keys", "bucket"):  # small: read whole (views of the live rows, or a copy of them)
            out[name] = np.asarray(out[name] if isinstance(out[name], np.ndarray) else out[name][0:n])
        if out["keys"].ndim != 1 or out["keys"].dtype != np.int64:
            raise InvalidBatchError(f"shard state table {tname!r}: keys {out['keys'].dtype}{out['keys'].shape}; expected int64[n]")
        b = out["bucket"]
        if n and (b.min() < 0 or b.max() >= buckets):
            raise InvalidBatchError(
                f"shard state table {tname!r}: bucket values in [{b.min()}, {b.max()}]; expected [0, {buckets})"
            )
        tables[tname] = out
    return meta, tables


def _bucket_order(bucket: np.ndarray, buckets: int) -> tuple[np.ndarray | None, np.ndarray]:
    """Row order that sorts by bucket (None when already sorted) and the per-bucket row offsets."""
    b = bucket.astype(np.int64, copy=False)
    order = None
    if b.size and np.any(b[1:] < b[:-1]):
        order = np.argsort(b, kind="stable")
        b = b[order]
    offsets = np.searchsorted(b, np.arange(buckets + 1), side="left").astype(np.int64)
    return order, offsets


def _is_row_source(arr: Any) -> bool:
    """A row store read chunk by chunk (:class:`~carls_dask.bank.rowview.RowView`): not copied whole."""
    return not isinstance(arr, np.ndarray) and all(hasattr(arr, a) for a in ("shape", "dtype", "__getitem__"))


def _gather(a: Any, order: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of ``a`` in bucket order (a copy of those rows only)."""
    if order is None:
        return np.ascontiguousarray(a[lo:hi])
    if isinstance(a, np.ndarray) and a.flags.c_contiguous:
        return np.take(a, order[lo:hi], axis=0)
    return np.asarray(a[order[lo:hi]])  # a strided view (np.take would copy it whole first), or a row store


def _write_array(z: zarr.Array, folder: pathlib.Path, a: Any, order: np.ndarray | None) -> None:
    """Write ``a`` (in bucket order) chunk by chunk: never a copy of the whole array."""
    if write_chunks(z, folder, a, order):
        return
    c = int(z.chunks[0])
    for lo in range(0, int(a.shape[0]), c):
        hi = min(int(a.shape[0]), lo + c)
        z[lo:hi] = _gather(a, order, lo, hi)


def write_shard(
    handle: SnapshotHandle,
    state: Mapping[str, Any],
    *,
    delta_seq: int,
    deleted: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    live_rows: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Write one shard's state (or its changes since ``handle.parent``) as whole Zarr chunks, then fsync it.

    Every array is written chunk by chunk (rows gathered into bucket order one chunk at a time), so the
    state may hold views of a live shard's rows (:meth:`ShardCore.state_view
    <carls_dask.bank.core.ShardCore.state_view>`) and no copy of the whole state is made; the caller keeps
    them unchanged until this returns.

    Parameters
    ----------
    handle : SnapshotHandle
        From :func:`begin_snapshot`.
    state : dict
        ``{"meta": ..., "tables": ...}`` as ``ShardCore.export_state()`` (or ``state_view()``) returns it;
        for an increment, ``ShardCore.export_changes()`` (the changed rows only).
    delta_seq : int
        Sequence number of the last delta-log record this state includes: the shard's ``DeltaLog.seq``
        (0 for a bank without a delta log). Replays after this snapshot start past it.
    deleted : dict, optional
        Given for an increment on ``handle.parent``: per table, ``keys`` (int64) and ``bucket`` (int32)
        deleted since the parent (``export_changes()["deleted"]``). None: ``state`` is the full state.
    live_rows : dict, optional
        For an increment: the rows each table holds after it (for the manifest's row counts).

    Returns
    -------
    dict
        The shard's entry (rows per table, bytes, delta_seq, parent), also written to ``shard-NNNN.json``.

    Raises
    ------
    StoreLockedError
        If this shard is already written or being written in this snapshot.
    LifecycleError
        If the snapshot is already committed or its folder is gone.
    """
    t0 = time.perf_counter()
    meta, tables = _validate_state(state)
    shard = int(meta["shard"])
    vdir = handle.path
    what = f"snapshot v{handle.version} of {handle.root}, shard {shard}"
    if isinstance(delta_seq, bool) or not isinstance(delta_seq, int | np.integer) or delta_seq < 0:
        raise InvalidBatchError(f"{what}: delta_seq={delta_seq!r}; expected the shard's delta-log sequence number, "
                                "an int >= 0")
    if deleted is not None and handle.parent is None:
        raise InvalidBatchError(f"{what}: an increment (deleted=...) on a snapshot begun without a parent; "
                                "expected begin_snapshot(parent=...)")
    if deleted is not None:
        for tname in tables:
            d = deleted.get(tname)
            if d is None or "keys" not in d or "bucket" not in d \
                    or np.asarray(d["keys"]).shape != np.asarray(d["bucket"]).shape:
                raise InvalidBatchError(f"{what}: deleted keys of table {tname!r}: got {type(d).__name__}; expected "
                                        "row-aligned 'keys' and 'bucket'")
    if not vdir.is_dir():
        raise LifecycleError(f"{what}: version folder {vdir} is missing; expected one made by begin_snapshot")
    if (vdir / "snapshot.json").exists():
        raise LifecycleError(f"{what}: the snapshot is already committed; begin a new one")
    marker = vdir / f"{shard_name(shard)}.writing"
    left_behind = marker.exists()
    try:
        lock = WriterLock(marker, what)  # held while writing; the kernel drops it when a killed writer dies
    except StoreLockedError:
        raise StoreLockedError(f"{what}: another writer already writes this shard ({marker} is locked); "
                               "expected one writer") from None
    zroot, described_json = vdir / f"{shard_name(shard)}.zarr", vdir / f"{shard_name(shard)}.json"
    if left_behind:  # a writer of this shard died mid-write (a killed worker whose shard re-homed and retries)
        logger.info("%s: a writer of this shard stopped mid-write; its parts are written again", what)
        described_json.unlink(missing_ok=True)
        shutil.rmtree(zroot, ignore_errors=True)
    elif described_json.exists() or zroot.exists():
        marker.unlink()
        lock.release()
        raise StoreLockedError(f"{what}: this shard is already written in this snapshot; expected one writer")
    try:
        info = _write_shard_parts(handle, vdir, shard, meta, tables, delta_seq, deleted, live_rows)
    except BaseException:
        lock.release()  # the marker stays: the next writer of this shard takes the parts over
        raise
    marker.unlink()
    lock.release()
    fsync_dir(vdir)
    logger.info("%s: wrote %.1f MB in %.2f s (%s)", what, info["bytes"] / 1e6, time.perf_counter() - t0,
                "full" if deleted is None else f"increment on v{handle.parent}")
    return info


def _write_shard_parts(handle: SnapshotHandle, vdir: pathlib.Path, shard: int, meta: Mapping[str, Any],
                       tables: Mapping[str, Any], delta_seq: int, deleted: Mapping[str, Any] | None,
                       live_rows: Mapping[str, int] | None) -> dict[str, Any]:
    """Write one shard's arrays, fsync them, then its ``shard-NNNN.json`` (the caller holds its ``.writing`` lock);
    returns the JSON's content."""
    zroot = vdir / f"{shard_name(shard)}.zarr"
    described_json = vdir / f"{shard_name(shard)}.json"
    buckets = int(meta["buckets"])
    compressors = _codecs(handle.compressor, handle.checksum)
    group = zarr.open_group(str(vdir / f"{shard_name(shard)}.zarr"), mode="w-", zarr_format=3)
    info_tables: dict[str, Any] = {}
    jobs: list[tuple[zarr.Array, pathlib.Path, Any, np.ndarray | None]] = []

    def add(tname: str, name: str, a: Any, order: np.ndarray | None, whole: bool = False) -> None:
        rows = handle.chunk_rows if not whole else max(1, int(a.shape[0]))
        z = group.create_array(
            f"{tname}/{name}",
            shape=tuple(a.shape),
            dtype=a.dtype,
            chunks=(max(1, min(rows, int(a.shape[0]))), *a.shape[1:]),
            compressors=compressors,
            fill_value=0,
            # every chunk is written, even all-zero ones, so a missing chunk file means damage
            config={"write_empty_chunks": True},
        )
        if int(a.shape[0]):
            jobs.append((z, zroot / tname / name, a, order))

    for tname, arrays in tables.items():
        order, offsets = _bucket_order(arrays["bucket"], buckets)
        described: dict[str, Any] = {}
        for name, a in arrays.items():
            add(tname, name, a, order)
            described[name] = {"dtype": a.dtype.str, "shape": list(a.shape[1:])}
        add(tname, "bucket_offsets", offsets, None, whole=True)
        stored = int(arrays["keys"].shape[0])
        entry: dict[str, Any] = {"rows": stored, "arrays": described}
        if deleted is not None:
            dk = np.asarray(deleted[tname]["keys"], dtype=np.int64)
            add(tname, "deleted_keys", dk, None, whole=True)
            add(tname, "deleted_bucket", np.asarray(deleted[tname]["bucket"], dtype=np.int32), None, whole=True)
            entry.update(stored=stored, deleted=int(dk.shape[0]),
                         rows=int((live_rows or {}).get(tname, stored)))
        info_tables[tname] = entry
    # arrays are written concurrently (gathers and file writes release the GIL), one chunk at a time each
    with concurrent.futures.ThreadPoolExecutor(IO_THREADS) as pool:
        list(pool.map(lambda job: _write_array(*job), jobs))
    nbytes = fsync_tree(vdir / f"{shard_name(shard)}.zarr")
    info = {
        "shard": shard,
        "meta": _jsonable(meta),
        "tables": info_tables,
        "bytes": nbytes,
        "delta_seq": int(delta_seq),
        "chunk_rows": handle.chunk_rows,
        "parent": None if deleted is None else int(handle.parent),  # type: ignore[arg-type]
    }
    atomic_write_json(described_json, info)
    return info


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def shard_info(handle: SnapshotHandle, shard: int) -> dict[str, Any] | None:
    """The entry :func:`write_shard` left for ``shard`` in this snapshot, or None if not written yet."""
    path = handle.path / f"{shard_name(shard)}.json"
    return read_json(path, f"snapshot v{handle.version}, shard {shard}") if path.exists() else None


def commit_snapshot(handle: SnapshotHandle, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Commit a snapshot whose shards are all written: write ``snapshot.json``, then swap the manifest.

    Parameters
    ----------
    handle : SnapshotHandle
        From :func:`begin_snapshot`.
    meta : dict, optional
        JSON-able bank-level facts to keep (name, table specs, config, ...). ``meta["n_shards"]``, if
        given, is the number of shards that must be present; otherwise the shards' own ``n_shards``.
        The order of ``meta["tables"]`` (the order the bank was created with its tables) is kept as
        ``meta["table_order"]``, since the manifest's JSON is written with sorted keys.

    Returns
    -------
    dict
        The new manifest entry (as listed by :func:`list_snapshots`).

    Raises
    ------
    LifecycleError
        If a shard is missing or the snapshot is already committed; nothing is changed.
    CorruptStoreError
        If the shards disagree (bucket counts, overlapping owned buckets).
    """
    meta = dict(_jsonable(dict(meta or {})))
    if isinstance(meta.get("tables"), Mapping) and "table_order" not in meta:
        meta["table_order"] = [str(t) for t in meta["tables"]]
    vdir = handle.path
    what = f"snapshot v{handle.version} of {handle.root}"
    if not vdir.is_dir():
        raise LifecycleError(f"{what}: version folder {vdir} is missing; expected one made by begin_snapshot")
    if (vdir / "snapshot.json").exists():
        raise LifecycleError(f"{what}: already committed")
    infos = {}
    for p in sorted(vdir.glob("shard-*.json")):
        info = read_json(p, what)
        infos[int(info["shard"])] = info
    if not infos:
        raise LifecycleError(f"{what}: no shard was written; expected write_shard before commit_snapshot")
    n_shards = int(meta.get("n_shards", next(iter(infos.values()))["meta"]["n_shards"]))
    missing = sorted(set(range(n_shards)) - set(infos))
    if missing:
        raise LifecycleError(
            f"{what}: shards {missing} are not written; expected all of 0..{n_shards - 1} before commit"
        )
    buckets = {int(i["meta"]["buckets"]) for i in infos.values()}
    if len(buckets) != 1:
        raise CorruptStoreError(f"{what}: shards disagree on the bucket count ({sorted(buckets)}); expected one")
    owned: dict[int, int] = {}
    for s, info in infos.items():
        for b in info["meta"]["owned_buckets"]:
            if b in owned:
                raise CorruptStoreError(f"{what}: bucket {b} is owned by shards {owned[b]} and {s}; expected one owner")
            owned[b] = s
    makers: list[str] = []
    for s in sorted(infos):
        for m in infos[s]["meta"].get("makers", []):
            if m not in makers:
                makers.append(m)
    tables: dict[str, Any] = {}
    for s in sorted(infos):
        for tname, t in infos[s]["tables"].items():
            cur = tables.setdefault(tname, {"rows": 0, "arrays": t["arrays"]})
            cur["rows"] += t["rows"]
            if cur["arrays"] != t["arrays"]:
                raise CorruptStoreError(
                    f"{what}: table {tname!r} has arrays {t['arrays']} on shard {s} but {cur['arrays']} elsewhere"
                )
    entry: dict[str, Any] = {
        "version": handle.version,
        "step": handle.step,
        "created": time.time(),
        "n_shards": n_shards,
        "buckets": buckets.pop(),
        "rows": {k: v["rows"] for k, v in tables.items()},
        "bytes": int(sum(i["bytes"] for i in infos.values())),
        "path": f"{SNAPSHOTS}/{version_name(handle.version)}",
        **_lineage(pathlib.Path(handle.root), infos, what),
    }
    full = {
        "format": FORMAT,
        "kind": KIND,
        **entry,
        "meta": meta,
        "makers": makers,
        "tables": tables,
        "shards": {str(s): infos[s] for s in sorted(infos)},
    }
    atomic_write_json(vdir / "snapshot.json", full)
    rootp = pathlib.Path(handle.root)
    with short_lock(rootp / ".manifest.lock", f"bank store {rootp}"):
        man = load_root_manifest(rootp)
        man["snapshots"] = sorted([*man["snapshots"], entry], key=lambda e: e["version"])
        atomic_write_json(rootp / MANIFEST, man)
    logger.info("%s committed: %s rows, %.1f MB", what, entry["rows"], int(entry["bytes"]) / 1e6)
    return entry


def _lineage(rootp: pathlib.Path, infos: Mapping[int, Mapping[str, Any]], what: str) -> dict[str, Any]:
    """Manifest fields of a version's increments: ``parent``, ``depends`` (every version needed to read it),
    ``chain`` (increments since the newest full snapshot) and ``changed_rows`` (rows those increments hold)."""
    parents = sorted({int(i["parent"]) for i in infos.values() if i.get("parent") is not None})
    if not parents:
        return {"parent": None, "depends": [], "chain": 0, "changed_rows": 0}
    listed = {int(e["version"]): e for e in list_snapshots(rootp)}
    depends: set[int] = set(parents)
    chain = changed = 0
    for p in parents:
        if p not in listed:
            raise LifecycleError(f"{what}: parent version {p} is not committed (pruned?); expected a full snapshot")
        depends |= {int(v) for v in listed[p].get("depends", [])}
        chain = max(chain, int(listed[p].get("chain", 0)))
        changed = max(changed, int(listed[p].get("changed_rows", 0)))
    stored = sum(int(t.get("stored", t["rows"])) for i in infos.values() if i.get("parent") is not None
                 for t in i["tables"].values())
    return {"parent": parents[-1], "depends": sorted(depends), "chain": chain + 1, "changed_rows": changed + stored}


def prune_versions(root: str | os.PathLike[str], keep: int) -> tuple[list[int], dict[str, Any] | None]:
    """Delete all but the newest ``keep`` committed snapshots (and the versions they build on), and abandoned ones.

    A kept incremental snapshot keeps every version it is read from (its ``depends``: its parent, the
    parent's parent, ... down to a full snapshot), so a kept version is always readable. The manifest is rewritten first (atomically), then the folders are removed, so a crash in between
    leaves only unlisted folders that the next prune removes. Delta-log segments are not touched here:
    :func:`carls_dask.storage.bankstore.prune_snapshots` prunes both.

    Returns
    -------
    removed : list of int
        The versions removed (committed and abandoned).
    oldest : dict or None
        The manifest of the oldest snapshot kept (None when none is committed).
    """
    rootp = pathlib.Path(root)
    if int(keep) < 1:
        raise InvalidBatchError(f"prune of {rootp}: keep={keep!r}; expected an integer >= 1")
    with short_lock(rootp / ".manifest.lock", f"bank store {rootp}"):
        man = load_root_manifest(rootp)
        snaps = man["snapshots"]
        newest = snaps[max(0, len(snaps) - int(keep)) :]
        needed = {int(e["version"]) for e in newest} | {int(v) for e in newest for v in e.get("depends", [])}
        drop = [e for e in snaps if int(e["version"]) not in needed]
        man["snapshots"] = [e for e in snaps if int(e["version"]) in needed]
        if drop:
            atomic_write_json(rootp / MANIFEST, man)
    kept = {e["version"] for e in man["snapshots"]}
    newest = max(kept, default=0)
    removed = [e["version"] for e in drop]
    snapdir = rootp / SNAPSHOTS
    for p in sorted(snapdir.iterdir()) if snapdir.is_dir() else []:
        m = VERSION_RE.match(p.name)
        if not m:
            continue
        v = int(m.group(1))
        # versions above the newest committed may still be being written: leave them alone
        if v not in kept and v < newest:
            shutil.rmtree(p, ignore_errors=True)
            if v not in removed:
                removed.append(v)
    if snapdir.is_dir():
        fsync_dir(snapdir)
    oldest = read_manifest(rootp, man["snapshots"][0]["version"]) if man["snapshots"] else None
    logger.info("pruned snapshots %s from %s", sorted(removed), rootp)
    return sorted(removed), oldest


# --------------------------------------------------------------------------------------------- reading


def _chunk_spans(ranges: Iterable[tuple[int, int]], chunk: int, n: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        s, e = (a // chunk) * chunk, min(n, -(-b // chunk) * chunk)
        if spans and s <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], e))
        else:
            spans.append((s, e))
    return spans



def read_snapshot(
    root: str | os.PathLike[str],
    version: int | None = None,
    buckets: Iterable[int] | np.ndarray | None = None,
    *,
    tables: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    expect: Mapping[str, Mapping[str, tuple[Any, Sequence[int]]]] | None = None,
    shards: Iterable[int] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Read a committed snapshot's rows, optionally only those of a set of buckets.

    Parameters
    ----------
    root : path-like
        The bank store.
    version : int, optional
        Snapshot version; the newest when None.
    buckets : iterable of int, optional
        Only rows of these buckets (a new shard's owned set); only the chunks holding them are read.
    tables : sequence of str, optional
        Only these tables.
    names : sequence of str, optional
        Only these arrays (``keys`` and ``bucket`` always come along).
    expect : dict, optional
        ``{table: {name: (dtype, row_shape)}}`` the caller will load the rows into (e.g. a running bank's
        columns); any difference raises before anything is read.
    shards : iterable of int, optional
        Only the rows the snapshot holds for these of its shards (all when None).

    Returns
    -------
    dict
        ``{table: {name: ndarray}}`` in the shard-state format, rows of all shards concatenated (shard by
        shard, each sorted by bucket). ``prov/maker`` codes index ``read_manifest(root, version)["makers"]``.

    Raises
    ------
    StoreNotFoundError, IncompatibleStoreError, CorruptStoreError
        Missing store or version, other format, damaged/missing chunks, or arrays unlike ``expect``.
    """
    what, want_tables, plans, totals, dtypes = _plan_read(root, version, buckets, tables, names, expect, shards)
    out: dict[str, dict[str, np.ndarray]] = {
        t: {nm: np.empty((totals[t], *shape), dtype=dt) for nm, (dt, shape) in dtypes[t].items()}
        for t in want_tables
    }
    pos: dict[str, int] = dict.fromkeys(want_tables, 0)
    jobs: list[tuple[Any, ...]] = []
    for plan in plans:
        jobs += plan.jobs(what, plan.pieces, out[plan.table], pos[plan.table])
        pos[plan.table] += plan.rows
    _run_reads(what, jobs)
    return out


def iter_snapshot(
    root: str | os.PathLike[str],
    version: int | None = None,
    buckets: Iterable[int] | np.ndarray | None = None,
    *,
    tables: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    shards: Iterable[int] | None = None,
    block_bytes: int = 64 << 20,
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """:func:`read_snapshot` block by block: ``(table, arrays)`` of at most about ``block_bytes`` each.

    The blocks come in the order of :func:`read_snapshot`'s rows (a table's rows of one saved shard, then the
    next); each holds whole chunks (at least one). A reader that loads them one at a time (a shard's restore)
    holds one block beyond what it loaded, instead of a whole copy of the rows. Parameters and errors as in
    :func:`read_snapshot`; the plan (and every check before reading) is made before the first block.
    """
    what, _, plans, _, dtypes = _plan_read(root, version, buckets, tables, names, None, shards)
    for plan in plans:
        types = {nm: dtypes[plan.table][nm] for nm in plan.names}
        row_bytes = sum(dt.itemsize * int(np.prod(shape, dtype=np.int64)) for dt, shape in types.values())
        limit = max(1, int(block_bytes) // max(row_bytes, 1))
        block: list[tuple[int, int, np.ndarray | None, int]] = []
        rows = 0
        for piece in [*plan.pieces, None]:
            if block and (piece is None or rows + piece[3] > limit):
                out = {nm: np.empty((rows, *shape), dtype=dt) for nm, (dt, shape) in types.items()}
                _run_reads(what, plan.jobs(what, block, out, 0))
                yield plan.table, out
                block, rows = [], 0
            if piece is not None:
                block.append(piece)
                rows += piece[3]


def _pieces(spans: list[tuple[int, int]], masks: list[np.ndarray] | None, chunk: int
            ) -> list[tuple[int, int, np.ndarray | None, int]]:
    """``(first row, end row, wanted rows or None for all, rows)`` of each chunk to read of the spans."""
    pieces: list[tuple[int, int, np.ndarray | None, int]] = []
    for i, (s, e) in enumerate(spans):
        for lo in range(s, e, chunk):
            hi = min(e, lo + chunk)
            idx = None if masks is None else np.flatnonzero(masks[i][lo - s : hi - s])
            if idx is not None and idx.size == hi - lo:
                idx = None
            if idx is not None and idx.size == 0:
                continue
            pieces.append((lo, hi, idx, hi - lo if idx is None else int(idx.size)))
    return pieces


@dataclasses.dataclass
class _ReadPlan:
    """The chunks of one saved shard's table a read takes (see :func:`_plan_read`)."""

    shard: str
    group: zarr.Group
    path: pathlib.Path
    code_map: np.ndarray
    table: str
    names: list[str]
    pieces: list[tuple[int, int, np.ndarray | None, int]]
    rows: int
    opened: dict[str, tuple[zarr.Array, bool | None]] = dataclasses.field(default_factory=dict)

    def jobs(self, what: str, pieces: Sequence[tuple[int, int, np.ndarray | None, int]],
             out: Mapping[str, np.ndarray], at: int) -> list[tuple[Any, ...]]:
        """One read job per array and piece, filling ``out`` from row ``at`` on."""
        jobs: list[tuple[Any, ...]] = []
        for nm in self.names:
            if nm not in self.opened:  # opened and its chunks checked once per plan, not once per block
                z = open_checked(self.group, f"{self.table}/{nm}")
                check_chunks(z, self.path / self.table / nm, what)
                self.opened[nm] = (z, plain_codecs(z))
            z, plain = self.opened[nm]
            p = at
            for lo, hi, idx, n in pieces:
                jobs.append((self.shard, z, plain, self.path / self.table / nm, out[nm], (lo, hi, p, idx),
                             self.code_map if nm == "prov/maker" else None))
                p += n
        return jobs


def _run_reads(what: str, jobs: Sequence[tuple[Any, ...]]) -> None:
    """Run read jobs in threads, so that the reads and checksums of different chunks overlap."""

    def fill(job: tuple[Any, ...]) -> None:
        s_key, z, plain, folder, dest, (lo, hi, p, idx), code_map = job
        try:
            if idx is None:
                part = dest[p : p + hi - lo]
                read_rows(z, folder, lo, hi, part, plain=plain)
            else:
                row_bytes = z.dtype.itemsize * int(np.prod(z.shape[1:], dtype=np.int64))
                block = scratch((hi - lo) * row_bytes).view(z.dtype).reshape(hi - lo, *z.shape[1:])
                read_rows(z, folder, lo, hi, block, plain=plain)
                part = dest[p : p + idx.size]
                np.take(block, idx, axis=0, out=part, mode="clip")  # idx < hi - lo: clip never clips
            if code_map is not None and part.size:
                if part.min() < 0 or part.max() >= code_map.shape[0]:
                    raise CorruptStoreError(f"{what}: shard {s_key} has maker codes outside its maker list")
                part[...] = code_map[part]
        except (CorruptStoreError, StoreNotFoundError):
            raise
        except Exception as exc:  # zarr raises assorted errors on damaged chunks (checksum, decode)
            raise CorruptStoreError(f"{what}: shard {s_key}, {folder.name} cannot be read: {exc}") from exc

    with concurrent.futures.ThreadPoolExecutor(IO_THREADS) as pool:
        for f in [pool.submit(fill, job) for job in jobs]:
            f.result()  # re-raises the first failure


def _plan_read(
    root: str | os.PathLike[str],
    version: int | None,
    buckets: Iterable[int] | np.ndarray | None,
    tables: Sequence[str] | None,
    names: Sequence[str] | None,
    expect: Mapping[str, Mapping[str, tuple[Any, Sequence[int]]]] | None,
    shards: Iterable[int] | None,
) -> tuple[str, list[str], list[_ReadPlan], dict[str, int], dict[str, dict[str, tuple[np.dtype, tuple[int, ...]]]]]:
    """What a read of a snapshot reads (see :func:`read_snapshot`): per saved shard and table, the chunk-aligned
    pieces of rows and, with a bucket set, which rows of each piece are wanted; and the rows and dtypes per table."""
    rootp = pathlib.Path(root)
    man = read_manifest(rootp, version)
    what = f"snapshot v{man['version']} of {rootp}"
    vdir = rootp / man["path"]
    want_tables = list(man["tables"]) if tables is None else list(tables)
    for t in want_tables:
        if t not in man["tables"]:
            raise StoreNotFoundError(f"{what}: no table {t!r}; tables are {sorted(man['tables'])}")
    for t, arrays in (expect or {}).items():
        stored = man["tables"].get(t, {}).get("arrays", {})
        for nm, (dtype, shape) in arrays.items():
            if nm not in stored:
                raise IncompatibleStoreError(
                    f"{what}: table {t!r} has no array {nm!r}; it has {sorted(stored)}"
                )
            got = (np.dtype(stored[nm]["dtype"]), tuple(stored[nm]["shape"]))
            if got != (np.dtype(dtype), tuple(shape)):
                raise IncompatibleStoreError(
                    f"{what}: table {t!r}, array {nm!r} is {got[0]}{list(got[1])} per row; "
                    f"expected {np.dtype(dtype)}{list(shape)}"
                )
    only = None if shards is None else {int(s) for s in shards}
    if only is not None and not only <= {int(s) for s in man["shards"]}:
        raise StoreNotFoundError(f"{what}: no shard {sorted(only - {int(s) for s in man['shards']})}; "
                                 f"it holds shards {sorted(int(s) for s in man['shards'])}")
    wanted = None if buckets is None else np.unique(np.asarray(
        buckets if isinstance(buckets, np.ndarray) else list(buckets), dtype=np.int64))
    makers = man["makers"]
    # plan: per shard and table, the chunk-aligned row spans to read and (with a bucket set) row masks
    plans: list[_ReadPlan] = []
    totals: dict[str, int] = dict.fromkeys(want_tables, 0)
    dtypes: dict[str, dict[str, tuple[np.dtype, tuple[int, ...]]]] = {t: {} for t in want_tables}
    for s_key, info in man["shards"].items():
        if only is not None and int(s_key) not in only:
            continue
        zpath = vdir / f"{shard_name(int(s_key))}.zarr"
        if not zpath.is_dir():
            raise CorruptStoreError(f"{what}: shard store {zpath} is missing; expected one per shard")
        group = zarr.open_group(str(zpath), mode="r", zarr_format=3)
        code_map = np.array([makers.index(m) for m in info["meta"].get("makers", [])] or [0], dtype=np.int32)
        for tname in want_tables:
            tinfo = info["tables"].get(tname)
            if tinfo is None:
                raise CorruptStoreError(f"{what}: shard {s_key} lacks table {tname!r}")
            arr_names = list(tinfo["arrays"]) if names is None else list(dict.fromkeys(["keys", "bucket", *names]))
            for nm in arr_names:
                if nm not in tinfo["arrays"]:
                    raise StoreNotFoundError(
                        f"{what}: table {tname!r} has no array {nm!r}; it has {sorted(tinfo['arrays'])}"
                    )
                desc = tinfo["arrays"][nm]
                dtypes[tname][nm] = (np.dtype(desc["dtype"]), tuple(desc["shape"]))
            n = int(tinfo.get("stored", tinfo["rows"]))  # an increment stores fewer rows than the bank holds
            masks: list[np.ndarray] | None = None
            try:
                if wanted is None:
                    spans, masks, rows = ([(0, n)] if n else []), None, n
                else:
                    offsets = np.asarray(open_checked(group, f"{tname}/bucket_offsets")[...])
                    sel = wanted[(wanted >= 0) & (wanted < offsets.shape[0] - 1)]
                    ranges = sorted(zip(offsets[sel].tolist(), offsets[sel + 1].tolist(), strict=True))
                    spans = _chunk_spans(ranges, int(info.get("chunk_rows", 65536)), n)
                    bucket_arr = open_checked(group, f"{tname}/bucket")
                    masks = []
                    for s, e in spans:
                        bblock = np.empty(e - s, dtype=bucket_arr.dtype)
                        read_rows(bucket_arr, zpath / tname / "bucket", s, e, bblock)
                        masks.append(np.isin(bblock, wanted))
                    rows = int(sum(int(m.sum()) for m in masks))
            except (CorruptStoreError, StoreNotFoundError):
                raise
            except Exception as exc:  # zarr raises assorted errors on damaged chunks (checksum, decode)
                raise CorruptStoreError(f"{what}: shard {s_key}, table {tname!r} cannot be read: {exc}") from exc
            plans.append(_ReadPlan(s_key, group, zpath, code_map, tname, arr_names,
                                   _pieces(spans, masks, int(info.get("chunk_rows", 65536))), rows))
            totals[tname] += rows
    return what, want_tables, plans, totals, dtypes


def read_deleted(
    root: str | os.PathLike[str],
    version: int,
    shard: int,
    buckets: Iterable[int] | np.ndarray | None = None,
    *,
    tables: Sequence[str] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Keys an incremental snapshot's shard deleted since its parent: ``{table: {"keys", "bucket"}}``.

    Empty arrays for a shard written in full. ``buckets`` keeps only keys of those buckets.
    """
    rootp = pathlib.Path(root)
    man = read_manifest(rootp, version)
    what = f"snapshot v{man['version']} of {rootp}, shard {shard}"
    info = man["shards"].get(str(int(shard)))
    if info is None:
        raise StoreNotFoundError(f"{what}: no such shard; it holds shards {sorted(int(s) for s in man['shards'])}")
    zpath = rootp / man["path"] / f"{shard_name(int(shard))}.zarr"
    wanted = None if buckets is None else np.asarray(
        buckets if isinstance(buckets, np.ndarray) else list(buckets), dtype=np.int64)
    out: dict[str, dict[str, np.ndarray]] = {}
    for tname in list(info["tables"]) if tables is None else list(tables):
        tinfo = info["tables"].get(tname)
        if tinfo is None:
            raise CorruptStoreError(f"{what}: lacks table {tname!r}")
        keys, bucket = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        if info.get("parent") is not None and int(tinfo.get("deleted", 0)):
            try:
                group = zarr.open_group(str(zpath), mode="r", zarr_format=3)
                zk, zb = open_checked(group, f"{tname}/deleted_keys"), open_checked(group, f"{tname}/deleted_bucket")
                keys, bucket = np.asarray(zk[...], dtype=np.int64), np.asarray(zb[...], dtype=np.int32)
            except (CorruptStoreError, StoreNotFoundError):
                raise
            except Exception as exc:  # zarr raises assorted errors on damaged chunks (checksum, decode)
                raise CorruptStoreError(f"{what}: deleted keys of table {tname!r} cannot be read: {exc}") from exc
            if keys.shape[0] != int(tinfo["deleted"]) or bucket.shape != keys.shape:
                raise CorruptStoreError(f"{what}: table {tname!r} holds {keys.shape[0]} deleted keys; "
                                        f"the manifest says {tinfo['deleted']}")
            if wanted is not None:
                mine = np.isin(bucket, wanted)
                keys, bucket = keys[mine], bucket[mine]
        out[tname] = {"keys": keys, "bucket": bucket}
    return out
