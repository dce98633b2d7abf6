"""A bank store as one thing: snapshots plus the delta log after them, replayed, decoded and pruned together.

A bank store (``RUN/bank``) holds committed snapshots (:mod:`carls_dask.storage.snapshots`, listed by
:mod:`carls_dask.storage.manifest`) and one delta log per shard (:mod:`carls_dask.storage.deltalog`).
Neither of those modules knows the other; this one composes them:

- :class:`BankReplay` yields the rows of a bank state in the order they must be applied: first a
  snapshot's rows (one batch per saved shard and table, optionally only some buckets), then the delta
  records written after it, with every ``prov/maker`` code translated into one maker list
  (:attr:`RowBatch.makers`). A bank shard's restore (``BankShard.restore``/``rehome_restore``) and the
  offline readers (:func:`carls_dask.storage.bankview.read_bank`, ``open_bank``) both apply it.
- The maker-name codec of the delta log (:data:`MAKERS_TABLE`, :func:`encode_makers`,
  :func:`decode_makers`): a shard logs the names of makers as it registers them, since its records carry
  only its own int32 codes.
- :func:`restore_point` picks what a re-homed shard rebuilds from; :func:`prune_snapshots` drops old
  snapshots and the delta-log segments they covered; :func:`truncate_log` drops the segments the newest
  snapshot covers (what a committed snapshot of a bank does with ``carls.storage.log-history: newest``);
  :func:`store_bytes` measures the store by part (snapshots, log).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.errors import CorruptStoreError, LifecycleError, StoreNotFoundError
from carls_dask.storage.deltalog import DeltaRecord, log_bytes, prune_segments, replay
from carls_dask.storage.manifest import SNAPSHOTS, delta_seqs, entry_at_step, list_snapshots, read_manifest
from carls_dask.storage.snapshots import iter_snapshot, prune_versions, read_deleted, read_snapshot

__all__ = [
    "MAKERS_TABLE",
    "BankReplay",
    "RowBatch",
    "decode_makers",
    "encode_makers",
    "next_parent",
    "prune_snapshots",
    "restore_point",
    "store_bytes",
    "truncate_log",
]

logger = logging.getLogger(__name__)

#: Pseudo-table in which a bank shard logs maker names as it registers them: ``keys`` are the shard's maker
#: codes, ``name_utf8`` (uint8[n, 256]) the UTF-8 names, zero-padded.
MAKERS_TABLE = "__makers__"
#: Bytes of a logged maker name (longer names are cut at a character boundary).
MAKER_NAME_BYTES = 256


def encode_makers(codes: Sequence[int], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Maker names as numeric, row-aligned arrays for a :data:`MAKERS_TABLE` delta record.

    Parameters
    ----------
    codes : sequence of int
        The shard's maker codes.
    names : sequence of str
        Their names, in the same order.
    """
    if len(codes) != len(names):
        raise CorruptStoreError(f"maker record: {len(codes)} codes for {len(names)} names; expected one per name")
    raw = np.zeros((len(names), MAKER_NAME_BYTES), dtype=np.uint8)
    for i, name in enumerate(names):
        b = name.encode("utf-8")[:MAKER_NAME_BYTES].decode("utf-8", "ignore").encode("utf-8")
        raw[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
    return {"keys": np.asarray(codes, dtype=np.int64), "name_utf8": raw}


def decode_makers(arrays: Mapping[str, np.ndarray]) -> dict[int, str]:
    """Inverse of :func:`encode_makers`: ``{code: name}``."""
    if "keys" not in arrays or "name_utf8" not in arrays:
        raise CorruptStoreError(f"maker record: arrays {sorted(arrays)}; expected 'keys' and 'name_utf8'")
    names = np.asarray(arrays["name_utf8"], dtype=np.uint8)
    if names.ndim != 2 or names.shape[0] != np.asarray(arrays["keys"]).shape[0]:
        raise CorruptStoreError(f"maker record: name_utf8 of shape {names.shape}; expected one row per code")
    return {
        int(code): bytes(row).rstrip(b"\x00").decode("utf-8", "replace")
        for code, row in zip(np.asarray(arrays["keys"]).tolist(), names, strict=True)
    }


@dataclasses.dataclass(frozen=True)
class RowBatch:
    """Rows to apply to a bank state, in :class:`BankReplay` order.

    Attributes
    ----------
    table : str
        The table.
    op : {"upsert", "delete"}
        ``"upsert"``: full rows in the shard-state format; ``"delete"``: ``keys`` (and ``bucket`` when
        the writer logged it).
    arrays : dict of str to ndarray
        Row-aligned arrays. ``prov/maker`` codes index :attr:`makers`.
    makers : list of str
        Maker names by code, for this batch's ``prov/maker``.
    shard : int
        The shard that wrote the rows: the saved shard of a snapshot, or the shard whose log holds the record.
    seq : int
        The record's sequence number in that shard's delta log; 0 for snapshot rows.
    step : int
        The snapshot's step, or the step recorded with the delta record.
    layered : bool
        Snapshot rows of an incremental snapshot's chain (a key may come more than once, deletes too).
    """

    table: str
    op: str
    arrays: dict[str, np.ndarray]
    makers: list[str]
    shard: int
    seq: int
    step: int
    layered: bool = False

    @property
    def from_snapshot(self) -> bool:
        """Whether the rows come from the snapshot (rather than from the delta log)."""
        return self.seq == 0


def _same_store(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


class BankReplay:
    """A bank state as batches of rows: a snapshot's rows, then the delta records after it, decoded.

    Iterate once; each :class:`RowBatch` is applied in order (upserts write full rows, deletes remove
    keys; the last event of a key wins).

    Parameters
    ----------
    root : path-like or None
        The bank store holding the snapshot; None for no snapshot (the log alone).
    version : int, optional
        The snapshot version; by default the newest at or before ``step`` (the newest when ``step`` is None).
    step : int, optional
        Only delta records up to this step (and, without ``version``, the newest snapshot at or before it).
    log_root : path-like, optional
        The store whose delta log to replay (default ``root``). When it is ``root``, only records after the
        snapshot (its shards' ``delta_seq``) are replayed; another store's log (that of a bank started from
        this snapshot) is replayed whole.
    replay_log : bool
        Replay the delta log at all.
    buckets : iterable of int, optional
        Only rows of these buckets (a shard's owned set): the snapshot reads only the chunks holding them,
        delta records are cut to them by their ``bucket`` array (records without one pass whole).
    tables : sequence of str, optional
        Only these tables (all the snapshot's, or every logged one, when None).
    records : sequence of DeltaRecord, optional
        Records already read from the log (as :func:`~carls_dask.storage.deltalog.replay` yields them),
        used instead of reading it again.
    block_bytes : int, optional
        Yield a snapshot's rows in batches of about this many bytes (whole chunks; see
        :func:`~carls_dask.storage.snapshots.iter_snapshot`), so that whoever applies them one at a time
        holds one batch beside what it loaded; None (the default) yields one batch per saved shard and table.

    Attributes
    ----------
    manifest : dict or None
        The snapshot's manifest (None without a snapshot).
    version : int
        The snapshot version (-1 without one).
    makers : list of str
        Maker names by code; it grows while the log is replayed (codes already handed out never change).

    Raises
    ------
    StoreNotFoundError, IncompatibleStoreError, CorruptStoreError
        Missing snapshot or table, another format, damaged data (when reached).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        version: int | None = None,
        *,
        step: int | None = None,
        log_root: str | os.PathLike[str] | None = None,
        replay_log: bool = True,
        buckets: Iterable[int] | np.ndarray | None = None,
        tables: Sequence[str] | None = None,
        records: Sequence[DeltaRecord] | None = None,
        block_bytes: int | None = None,
    ) -> None:
        if replay_log and log_root is None and root is None:
            raise StoreNotFoundError("bank replay: neither a snapshot store nor a log store; expected root or log_root")
        self.root = None if root is None else pathlib.Path(root)
        log = log_root if log_root is not None else root
        self.log_root = pathlib.Path(log) if replay_log and log is not None else None
        self.step = step
        self.tables = None if tables is None else list(tables)
        self.buckets = None if buckets is None else np.unique(np.asarray(
            buckets if isinstance(buckets, np.ndarray) else list(buckets), dtype=np.int64))
        self.records = records
        self.block_bytes = block_bytes
        self.manifest: dict[str, Any] | None = None
        self.version = -1
        if self.root is not None:
            v = version if version is not None else int(entry_at_step(self.root, step)["version"])
            self.manifest = read_manifest(self.root, v)
            self.version = int(self.manifest["version"])
        self.makers: list[str] = list(self.manifest["makers"]) if self.manifest is not None else []
        self._used = False

    def expected_rows(self) -> dict[str, int]:
        """About how many rows of each table the snapshot holds in :attr:`buckets` (all rows without a bucket set).

        A saved shard's rows are counted in proportion to the share of its buckets that are wanted (keys
        hash evenly over buckets), with a margin: what a restoring shard reserves before it loads them.
        """
        man = self.manifest
        if man is None:
            return {}
        want = None if self.buckets is None else set(self.buckets.tolist())
        out: dict[str, float] = {}
        for info in man["shards"].values():
            owned = info.get("meta", {}).get("owned_buckets") or []
            share = 1.0 if want is None or not owned else len(want.intersection(owned)) / len(owned)
            for table, tinfo in info["tables"].items():
                if self.tables is not None and table not in self.tables:
                    continue
                out[table] = out.get(table, 0) + int(tinfo.get("rows", 0)) * share
        return {t: int(n if want is None else n * 1.02 + 1024) for t, n in out.items()}

    def __iter__(self) -> Iterator[RowBatch]:
        if self._used:
            raise LifecycleError(f"bank replay of {self.root}: already iterated; expected one pass per BankReplay")
        self._used = True
        yield from self._snapshot_rows()
        if self.log_root is not None:
            yield from self._log_rows()

    def _snapshot_rows(self) -> Iterator[RowBatch]:
        """Per saved shard: its rows in the full snapshot its chain starts at, then each increment's deletes and
        upserts, oldest first (an increment names its ``parent`` per shard)."""
        man = self.manifest
        if man is None or self.root is None:
            return
        manifests: dict[int, dict[str, Any]] = {self.version: man}
        for s_key in man["shards"]:
            chain = [self.version]
            while (parent := manifests[chain[-1]]["shards"][s_key].get("parent")) is not None:
                if int(parent) not in manifests:
                    manifests[int(parent)] = read_manifest(self.root, int(parent))
                if s_key not in manifests[int(parent)]["shards"]:
                    raise CorruptStoreError(f"snapshot v{chain[-1]} of {self.root}: shard {s_key} builds on v{parent}, "
                                            "which has no such shard")
                chain.append(int(parent))
            layered = len(chain) > 1
            for v in reversed(chain):
                vman = manifests[v]
                lut = self._maker_lut(vman["makers"])
                if vman["shards"][s_key].get("parent") is not None:
                    gone = read_deleted(self.root, v, int(s_key), self.buckets, tables=self.tables)
                    for table, arrays in gone.items():
                        if arrays["keys"].size:
                            yield RowBatch(table, "delete", arrays, list(self.makers), int(s_key), 0,
                                           int(vman["step"]), layered)
                if self.block_bytes is None:
                    data: Iterable[tuple[str, dict[str, np.ndarray]]] = read_snapshot(
                        self.root, v, self.buckets, tables=self.tables, shards=[int(s_key)]).items()
                else:
                    data = iter_snapshot(self.root, v, self.buckets, tables=self.tables, shards=[int(s_key)],
                                         block_bytes=self.block_bytes)
                for table, arrays in data:
                    if lut is not None and "prov/maker" in arrays:
                        arrays["prov/maker"] = lut[arrays["prov/maker"]]
                    yield RowBatch(table, "upsert", arrays, list(self.makers), int(s_key), 0, int(vman["step"]),
                                   layered)

    def _maker_lut(self, names: Sequence[str]) -> np.ndarray | None:
        """Codes of an older version's maker list as indexes of :attr:`makers` (None when they are the same)."""
        if list(names) == self.makers[: len(names)]:
            return None
        for name in names:
            if name not in self.makers:
                self.makers.append(name)
        return np.array([self.makers.index(n) for n in names] or [0], dtype=np.int32)

    def _log_rows(self) -> Iterator[RowBatch]:
        assert self.log_root is not None
        man = self.manifest
        own_log = man is not None and self.root is not None and _same_store(self.root, self.log_root)
        # per logging shard: its maker codes -> names (its snapshot list, then what it logged)
        shard_makers: dict[int, dict[int, str]] = {}
        if own_log and man is not None:
            shard_makers = {int(s): dict(enumerate(i["meta"].get("makers", []))) for s, i in man["shards"].items()}
        if self.records is not None:
            records: Iterable[DeltaRecord] = self.records
        else:
            records = replay(
                self.log_root,
                since_seq=delta_seqs(man) if own_log and man is not None else None,
                until_step=self.step,
                tables=None if self.tables is None else [*self.tables, MAKERS_TABLE],
            )
        for rec in records:
            if rec.table == MAKERS_TABLE:
                shard_makers.setdefault(rec.shard, {}).update(decode_makers(rec.arrays))
                continue
            if self.tables is not None and rec.table not in self.tables:
                continue
            arrays = rec.arrays
            if self.buckets is not None and "bucket" in arrays:
                mine = np.isin(arrays["bucket"], self.buckets)
                if not mine.any():
                    continue
                if not mine.all():
                    arrays = {k: v[mine] for k, v in arrays.items()}
            if "prov/maker" in arrays:
                arrays = {**arrays, "prov/maker": self._recode(shard_makers.get(rec.shard, {}), arrays["prov/maker"])}
            yield RowBatch(rec.table, rec.op, arrays, list(self.makers), rec.shard, rec.seq, rec.step)

    def _recode(self, local: Mapping[int, str], codes: np.ndarray) -> np.ndarray:
        """A shard's maker codes as indexes of :attr:`makers` (codes it never named read as "")."""
        if "" not in self.makers:
            self.makers.append("")
        cmap = np.full(max(local, default=0) + 2, self.makers.index(""), dtype=np.int32)
        for code, name in local.items():
            if name not in self.makers:
                self.makers.append(name)
            cmap[code] = self.makers.index(name)
        c = np.asarray(codes, dtype=np.int64)
        return cmap[np.where((c >= 0) & (c < cmap.shape[0]), c, cmap.shape[0] - 1)]


def restore_point(
    root: str | os.PathLike[str], base: tuple[str, int] | None = None
) -> tuple[str | None, int | None]:
    """The snapshot a shard rebuilds from after its worker went away: ``(store, version)``.

    The newest committed snapshot of ``root`` when there is one; otherwise ``base`` (the ``(store,
    version)`` the bank was restored from, if any); otherwise ``(None, None)`` (the delta log alone).
    """
    try:
        man = read_manifest(root)
    except StoreNotFoundError:
        if base is None:
            return None, None
        return str(base[0]), int(base[1])
    return str(root), int(man["version"])


def next_parent(root: str | os.PathLike[str], compact_every: int, compact_fraction: float) -> int | None:
    """The version the next snapshot of ``root`` may be an increment on, or None when it must be full.

    Full when the store has no snapshot, when the newest is already ``compact_every`` increments past its
    full snapshot, or when the rows its increments hold exceed ``compact_fraction`` of the bank's rows
    (compaction: the next snapshot is a new base).
    """
    if int(compact_every) < 0 or not 0.0 <= float(compact_fraction):
        raise LifecycleError(f"snapshot compaction of {root}: every={compact_every!r}, fraction={compact_fraction!r}; "
                             "expected an int >= 0 and a fraction >= 0")
    rootp = pathlib.Path(root)
    snaps = list_snapshots(rootp) if rootp.is_dir() else []
    if not snaps or int(compact_every) == 0:
        return None
    newest = snaps[-1]
    rows = sum(int(v) for v in newest["rows"].values())
    if int(newest.get("chain", 0)) >= int(compact_every) or \
            int(newest.get("changed_rows", 0)) > float(compact_fraction) * max(rows, 1):
        return None
    return int(newest["version"])


def prune_snapshots(root: str | os.PathLike[str], keep: int) -> list[int]:
    """Delete all but the newest ``keep`` committed snapshots, abandoned partial ones, and covered delta logs.

    The manifest is rewritten first (atomically), then the folders are removed, so a crash in between
    leaves only unlisted folders that the next prune removes. Delta-log segments whose records all
    precede the oldest kept snapshot are removed too (never a shard's newest segment).

    Returns
    -------
    list of int
        The versions removed (committed and abandoned).
    """
    removed, oldest = prune_versions(root, keep)
    if oldest is not None:
        segs = prune_segments(root, delta_seqs(oldest))
        logger.info("pruned %d delta-log segments of %s", len(segs), root)
    return removed


#: What a committed snapshot keeps of the delta log (``carls.storage.log-history``).
LOG_HISTORY = ("newest", "kept")


def truncate_log(root: str | os.PathLike[str], history: str = "newest") -> list[pathlib.Path]:
    """Drop the delta-log segments a committed snapshot of ``root`` covers; returns the files removed.

    ``history="newest"`` drops every segment the newest snapshot covers (the log then holds only what was
    written after it: a point-in-time read gets any kept snapshot's step, and any step after the newest);
    ``"kept"`` only those the oldest kept snapshot covers (step-exact reads back to it). A shard's newest
    segment is never removed; a bank shard starts a new one at each snapshot, so nothing covered stays.
    """
    if history not in LOG_HISTORY:
        raise LifecycleError(f"log truncation of {root}: history {history!r}; expected one of {LOG_HISTORY} "
                             "(carls.storage.log-history)")
    rootp = pathlib.Path(root)
    snaps = list_snapshots(rootp) if rootp.is_dir() else []
    if not snaps:
        return []
    man = read_manifest(rootp, int(snaps[-1 if history == "newest" else 0]["version"]))
    removed = prune_segments(rootp, delta_seqs(man))
    if removed:
        logger.info("truncated %d delta-log segments of %s covered by snapshot v%d", len(removed), rootp,
                    man["version"])
    return removed


def _tree_bytes(path: pathlib.Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # removed meanwhile (a prune)
                pass
    return total


def store_bytes(root: str | os.PathLike[str]) -> dict[str, int]:
    """The bytes of a bank store by part: ``snapshots`` (every version folder), ``log`` (the delta-log
    segments), ``other`` (manifests, locks) and ``total``."""
    rootp = pathlib.Path(root)
    if not rootp.is_dir():
        raise StoreNotFoundError(f"bank store {rootp}: no such folder; expected a run's bank folder (RUN/bank)")
    snaps = _tree_bytes(rootp / SNAPSHOTS)
    log = log_bytes(rootp)
    total = _tree_bytes(rootp)
    return {"snapshots": snaps, "log": log, "other": max(total - snaps - log, 0), "total": total}
