"""Read-only access to a run folder for the dashboards: the metric store, bank snapshots, held-out truth.

A run folder holds ``metrics.zarr`` (the metric store, see :mod:`carls_dask.storage.metrics`), ``bank/`` (snapshots
and delta log, see :mod:`carls_dask.storage.snapshots`) and optionally ``truth.npz`` (held-out labels: int64 arrays
``keys`` and ``labels``) used to judge pseudo labels. Nothing here takes a lock or writes a file, so a
dashboard never slows the run it watches; it only re-reads what changed (a file-modification check).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pathlib
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import xarray as xr

from carls_dask.errors import StoreError, StoreNotFoundError
from carls_dask.storage.runfolder import BANK, METRICS, RunFolder

__all__ = ["RunReader", "default_column", "default_table", "vector_columns"]

logger = logging.getLogger(__name__)

#: What a table's columns are: name to (dtype, shape of one row).
Columns = dict[str, tuple[np.dtype[Any], tuple[int, ...]]]


def vector_columns(columns: Columns) -> list[str]:
    """The float vector columns among ``columns`` (one row is a 1-D float vector of two or more elements), in order."""
    return [c for c, (dtype, shape) in columns.items() if dtype.kind == "f" and len(shape) == 1 and shape[0] >= 2]


def default_table(tables: dict[str, Columns]) -> str | None:
    """The table the dashboard shows first: the first table, in the order the bank was created with them,
    that has a float vector column; the first table when none has one; ``None`` for a bank without tables.

    (A paradigm lists its tables in ``tables()``; put the table to look at first there, or name it with
    ``--table``.)
    """
    for name, cols in tables.items():
        if vector_columns(cols):
            return name
    return next(iter(tables), None)


def default_column(columns: Columns) -> str | None:
    """The vector column shown first: ``embedding`` when the table has one, else its first float vector column."""
    vectors = vector_columns(columns)
    return "embedding" if "embedding" in vectors else next(iter(vectors), None)


def _mtime_ns(path: pathlib.Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


class RunReader:
    """Read a run folder's metrics and bank, caching immutable snapshots and re-reading only on change.

    Parameters
    ----------
    path
        The run folder.
    table
        The bank table the views show first (:attr:`table`); ``None``: the one :func:`default_table`
        picks from what the run's bank holds.
    cache_snapshots
        How many snapshot datasets to keep in memory.

    Every bank read takes a ``table`` (default :attr:`table`); the headline figures cover every table.
    """

    def __init__(self, path: str | os.PathLike[str], table: str | None = None, cache_snapshots: int = 4) -> None:
        self.path = pathlib.Path(path)
        self.folder = RunFolder(self.path)
        #: The table asked for (``None``: the default rule's).
        self.requested_table = table
        self._cache: OrderedDict[tuple[str, int], xr.Dataset] = OrderedDict()
        self._cache_size = cache_snapshots
        self._tables: dict[str, Columns] = {}
        self._tables_version = -1
        self._tables_lock = threading.Lock()
        self._metrics: xr.Dataset | None = None
        self._metrics_series: dict[str, Any] | None = None
        #: Metric rows read from the store so far (the cursor reads each committed row once).
        self.metric_rows_read = 0
        self._latest: dict[str, tuple[tuple[int, ...], xr.Dataset]] = {}
        self._truth: xr.DataArray | None = None
        self._truth_stamp = -1
        self._damage: list[str] = []
        self._damage_stamp: tuple[object, ...] = ()
        # Views refresh from several threads. One lock per cache, so that the cheap reads of the newest
        # state (every tick) never wait behind a long run of snapshot reads for the plots.
        self._snap_lock = threading.RLock()
        self._latest_lock = threading.Lock()
        self._metrics_lock = threading.Lock()
        self._truth_lock = threading.Lock()
        # The headline figures have their own cheap, incremental read (see :meth:`headline`).
        self._head_lock = threading.Lock()
        self._head_stamp: tuple[int, ...] = ()
        self._head: dict[str, float] | None = None
        self._bytes: tuple[tuple[int, ...], dict[str, int] | None] = ((), None)
        self._head_version = -1
        self._head_keys: dict[str, np.ndarray] = {}
        self._head_max: dict[str, float] = {}
        self._head_seq: dict[int, int] = {}

    # ------------------------------------------------------------------ what is there

    @property
    def metrics_path(self) -> pathlib.Path:
        """The run's metric store."""
        return self.folder.metrics

    @property
    def bank_path(self) -> pathlib.Path:
        """The run's bank store."""
        return self.folder.bank

    def damage(self) -> list[str]:
        """What the run lacks although it finished: each missing or unreadable part, one sentence each.

        Empty for a whole run and for one still going (see :func:`carls_dask.storage.runcheck.run_damage`).
        Checked again only when the result, the metric store's commit record or the bank's manifest changed.
        """
        from carls_dask.storage.runcheck import run_damage

        stamp = (_mtime_ns(self.folder.result), _mtime_ns(self.metrics_path / "metrics.json"),
                 _mtime_ns(self.bank_path / "manifest.json"), self.metrics_path.exists(), self.bank_path.exists())
        if stamp != self._damage_stamp:
            self._damage = run_damage(self.path)
            self._damage_stamp = stamp
        return list(self._damage)

    def problem(self) -> str | None:
        """A sentence saying why there is nothing to show yet, or ``None`` when the run has data."""
        if not self.path.exists():
            return f"Run folder {self.path} does not exist (yet). Start a run that writes there, or pass another RUN_PATH."
        if not self.path.is_dir():
            return f"Run path {self.path} is not a folder; expected a run folder with {METRICS} and {BANK}/."
        if not self.metrics_path.exists() and not (self.bank_path / "manifest.json").exists():
            damage = self.damage()
            if damage:
                return f"Run {self.path} finished, but {'; '.join(damage)}: there is nothing to show."
            return f"Run folder {self.path} is empty so far: no {METRICS} and no {BANK}/ snapshot. Waiting for the run to write."
        tables = self.tables()
        if self.requested_table is not None and tables and self.requested_table not in tables:
            return (f"Run {self.path}: its bank has no table {self.requested_table!r}; its tables are {list(tables)} "
                    "(name one of them with --table, or none for the default).")
        return None

    # ------------------------------------------------------------------ metrics

    def _metrics_index(self) -> dict[str, Any] | None:
        """The metric store's commit record (``metrics.json``): rows committed and where each series lives."""
        from carls_dask.storage.metrics import INDEX

        try:
            idx = json.loads((self.metrics_path / INDEX).read_text())
        except (OSError, ValueError):
            return None
        return idx if isinstance(idx, dict) and "rows" in idx and "series" in idx else None

    def _metrics_tail(self, old: xr.Dataset, idx: dict[str, Any]) -> xr.Dataset:
        """``old`` plus the rows committed since it was read, reading only those rows from Zarr."""
        import zarr

        start, stop = old.sizes["step"], int(idx["rows"])
        group = zarr.open_group(str(self.metrics_path), mode="r", zarr_format=3)
        steps = np.asarray(group["step"][start:stop])  # type: ignore[index]
        wall = np.asarray(group["wall_time"][start:stop])  # type: ignore[index]
        if (steps < 0).any():
            raise ValueError(f"{int((steps < 0).sum())} of the new rows {start}..{stop} are not on disk yet")
        data = {
            name: (("step", *e["dims"]), np.asarray(group[e["path"]][start:stop]))  # type: ignore[index]
            for name, e in idx["series"].items()
        }
        tail = xr.Dataset(data, coords={"step": steps, "wall_time": ("step", wall)})
        ds = xr.concat([old, tail], dim="step", data_vars="minimal", coords="minimal", join="outer")
        ds.attrs.update(old.attrs, rows=stop)
        self.metric_rows_read += stop - start
        return ds

    def _metrics_read(self) -> xr.Dataset | None:
        """The metric series (dimension ``step``), loaded into memory; ``None`` when the run has none.

        Keeps a cursor: when the store only gained rows since the last call, only those rows are read
        and appended; the whole store is read again only when a new series appeared. Returns the same
        object as last time when nothing was committed since.
        """
        if not self.metrics_path.exists():
            return None
        idx = self._metrics_index()
        old = self._metrics
        if idx is not None and old is not None:
            rows = int(idx["rows"])
            if rows == old.sizes["step"] and idx["series"] == self._metrics_series:
                return old
            if rows > old.sizes["step"] and idx["series"] == self._metrics_series:
                try:
                    self._metrics = self._metrics_tail(old, idx)
                    return self._metrics
                except Exception as exc:  # a racing writer: read the whole store below
                    logger.info("metric store %s: incremental read failed (%s); reading it whole", self.metrics_path, exc)
        try:
            mod = importlib.import_module("carls_dask.storage.metrics")
            ds = mod.open_metrics(self.metrics_path)
            ds = ds.load()
        except (StoreError, OSError, ValueError, KeyError) as exc:
            logger.warning("metric store %s not readable yet: %s", self.metrics_path, exc)
            return self._metrics
        self._metrics = ds
        self._metrics_series = idx["series"] if idx is not None and int(idx["rows"]) == ds.sizes["step"] else None
        self.metric_rows_read += ds.sizes["step"]
        return ds

    def series_names(self) -> list[str]:
        """Names of the metric store's series, from its commit record (cheap: no array is read); empty when none."""
        idx = self._metrics_index()
        return sorted(idx["series"]) if idx is not None else []

    def has(self, column: str, series: tuple[str, ...]) -> bool:
        """Whether a bank table has ``column``, or the metric store one of ``series`` (by name or as ``LOOP.name``).

        Cheap (the newest manifest and the metric store's commit record only): what a view asks to know
        whether the run has what it shows.
        """
        if any(column in cols for cols in self.tables().values()):
            return True
        return any(n.rpartition(".")[2] in series for n in self.series_names())

    # ------------------------------------------------------------------ bank

    @property
    def table(self) -> str | None:
        """The table the views show first: the one asked for, else :func:`default_table` of the bank's tables
        (``None`` while the run has no bank snapshot)."""
        return self.requested_table or default_table(self.table_columns())

    @table.setter
    def table(self, name: str | None) -> None:
        self.requested_table = name

    def table_columns(self) -> dict[str, Columns]:
        """Every table of the newest snapshot, in the order the bank was created with them, with its columns
        (name to dtype and row shape, in the table spec's order); empty without a snapshot.

        Cheap: the newest snapshot's manifest, read again only when a newer snapshot was committed.
        """
        from carls_dask.storage.bankview import table_columns, table_order
        from carls_dask.storage.snapshots import read_manifest

        try:
            snaps = self.snapshots()
        except StoreError as exc:  # a damaged store: the views say so (see damage()), with no table to show
            logger.debug("bank store %s: no tables to read: %s", self.bank_path, exc)
            return {}
        if not snaps:
            return {}
        version = int(snaps[-1]["version"])
        with self._tables_lock:
            if version != self._tables_version:
                try:
                    man = read_manifest(self.bank_path, version)
                except (StoreError, OSError, ValueError, KeyError):
                    return dict(self._tables)
                self._tables = {t: table_columns(man, t) for t in table_order(man)}
                self._tables_version = version
            return dict(self._tables)

    def tables(self) -> dict[str, list[str]]:
        """The bank's tables and the names of their columns as of the newest snapshot, in creation order
        (see :meth:`table_columns`); empty when there is none."""
        return {t: list(cols) for t, cols in self.table_columns().items()}

    def vector_tables(self) -> dict[str, list[str]]:
        """The tables that have a float vector column, with those columns (see :func:`vector_columns`)."""
        return {t: v for t, cols in self.table_columns().items() if (v := vector_columns(cols))}

    def _table(self, table: str | None) -> str | None:
        return table if table is not None else self.table

    def snapshots(self) -> list[dict[str, Any]]:
        """Committed bank snapshots, oldest first (each with ``version`` and ``step``); empty when none."""
        from carls_dask.storage.snapshots import list_snapshots

        if not (self.bank_path / "manifest.json").exists():
            return []
        try:
            return list_snapshots(self.bank_path)
        except StoreNotFoundError:
            return []

    def _snapshot(self, version: int, table: str | None) -> xr.Dataset:
        """One table as of a committed snapshot version (cached: snapshots never change)."""
        name = self._table(table)
        if name is None:
            raise StoreNotFoundError(f"bank store {self.bank_path}: no table to read (the run has no bank snapshot yet)")
        key = (name, int(version))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        from carls_dask.storage.bankview import open_snapshot

        ds = open_snapshot(self.bank_path, int(version), name, slots=False)
        self._cache[key] = ds
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ds

    def _bank_stamp(self) -> tuple[int, ...]:
        stamps = [_mtime_ns(self.bank_path / "manifest.json")]
        delta = self.bank_path / "delta"
        if delta.is_dir():
            for shard in sorted(delta.iterdir()):
                if shard.is_dir():
                    stamps.extend(_mtime_ns(seg) for seg in sorted(shard.glob("seg-*.log")))
        return tuple(stamps)

    def _latest_read(self, table: str | None) -> xr.Dataset | None:
        """One table as it is now (newest snapshot plus the delta log), or ``None`` when there is no bank
        or no such table. Re-reads only when the manifest or a delta segment changed."""
        from carls_dask.storage.bankview import open_bank

        name = self._table(table)
        if name is None:
            return None
        stamp = self._bank_stamp()
        cached = self._latest.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        if not (self.bank_path / "manifest.json").exists():
            return None
        try:
            ds = open_bank(self.bank_path, table=name).load()
        except (StoreNotFoundError, KeyError):  # no snapshot yet, or no such table
            return None
        except (StoreError, OSError, ValueError) as exc:
            logger.warning("bank store %s not readable yet: %s", self.bank_path, exc)
            return cached[1] if cached is not None else None
        self._latest[name] = (stamp, ds)
        return ds

    # ------------------------------------------------------------------ headline figures

    _HEAD_PROV = ("version", "model_step", "wall_time")

    def _head_base(self, version: int) -> None:
        """Start the headline state from committed snapshot ``version``: every table's keys and provenance maxima."""
        from carls_dask.storage.bankview import open_snapshot, table_order
        from carls_dask.storage.manifest import is_incremental
        from carls_dask.storage.snapshots import read_manifest, read_snapshot

        man = read_manifest(self.bank_path, version)
        self._head_seq = {int(s): int(i.get("delta_seq", 0)) for s, i in man.get("shards", {}).items()}
        self._head_keys = {}
        self._head_max = {}
        incremental = is_incremental(man)
        for table in table_order(man):
            arrays = man["tables"][table].get("arrays", {})
            names = [f"prov/{n}" for n in self._HEAD_PROV if f"prov/{n}" in arrays]
            if incremental:  # the rows of an increment are folded onto the versions it builds on
                ds = open_snapshot(self.bank_path, version, table, slots=False)
                got = {"keys": ds["key"].values, **{f"prov/{n}": ds[n].values for n in self._HEAD_PROV if n in ds}}
            else:
                got = read_snapshot(self.bank_path, version, tables=[table], names=names)[table]
            self._head_keys[table] = np.unique(np.asarray(got["keys"], np.int64))
            self._fold_max(got)
        self._head_version = version

    def _fold_max(self, arrays: dict[str, np.ndarray]) -> None:
        for n in self._HEAD_PROV:
            a = arrays.get(f"prov/{n}")
            if a is not None and np.size(a):
                v = float(np.nanmax(np.asarray(a, np.float64)))
                self._head_max[n] = max(self._head_max.get(n, v), v)

    def _headline_read(self) -> dict[str, float] | None:
        from carls_dask.storage.deltalog import replay

        stamp = self._bank_stamp()
        if stamp == self._head_stamp and self._head is not None:
            return self._head
        snaps = self.snapshots()
        if not snaps:
            return None
        try:
            version = int(snaps[-1]["version"])
            if version != self._head_version:
                self._head_base(version)
            seq = dict(self._head_seq)
            for rec in replay(self.bank_path, since_seq=seq, tables=list(self._head_keys)):
                self._head_seq[rec.shard] = max(self._head_seq.get(rec.shard, 0), rec.seq)
                keys = np.asarray(rec.arrays.get("keys", np.zeros(0, np.int64)), np.int64)
                held = self._head_keys.get(rec.table, np.zeros(0, np.int64))
                if rec.op == "delete":
                    self._head_keys[rec.table] = np.setdiff1d(held, keys, assume_unique=False)
                else:
                    self._head_keys[rec.table] = np.union1d(held, keys)
                    self._fold_max(rec.arrays)
        except StoreNotFoundError:
            return None
        except (StoreError, OSError, ValueError, KeyError) as exc:
            logger.warning("bank store %s not readable yet: %s", self.bank_path, exc)
            self._head_version = -1  # start over from the snapshot next time
            return self._head
        nan = float("nan")
        rows = sum(int(k.size) for k in self._head_keys.values())
        head = {"rows": float(rows)}
        head.update({n: self._head_max.get(n, nan) if rows else nan for n in self._HEAD_PROV})
        head["snapshots"] = float(len(snaps))
        head.update({f"rows/{t}": float(k.size) for t, k in self._head_keys.items()})
        self._head, self._head_stamp = head, stamp
        return head

    # ------------------------------------------------------------------ truth

    def _truth_read(self) -> xr.DataArray | None:
        """Held-out labels over ``key`` from ``truth.npz``, or ``None`` when the run has none."""
        p = self.folder.truth
        stamp = _mtime_ns(p)
        if stamp == 0:
            return None
        if stamp != self._truth_stamp:
            with np.load(p) as z:
                self._truth = xr.DataArray(
                    np.asarray(z["labels"], np.int64), dims="key", coords={"key": np.asarray(z["keys"], np.int64)}
                )
            self._truth_stamp = stamp
        return self._truth

    def now(self) -> float:
        """Current unix time."""
        return time.time()

    def finished(self) -> bool:
        """Whether the run has ended: it wrote ``result.json``, or its ``run.json`` records an end time."""
        if self.folder.finished():
            return True
        try:
            record = json.loads(self.folder.run_record.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(record, dict) and bool(record.get("ended"))

    def last_write(self) -> float | None:
        """Unix time of the run's newest write: its newest metric row or bank row (their ``wall_time``).

        Falls back on the modification time of the metric store and bank files when no row carries a
        time; ``None`` when the run has written nothing yet.
        """
        rows = []
        m = self.metrics()
        if m is not None and "wall_time" in m.variables and m.sizes.get("step", 0):
            rows.append(float(np.nanmax(np.asarray(m["wall_time"].values, np.float64))))
        head = self.headline()
        if head is not None:
            rows.append(float(head.get("wall_time", np.nan)))
        rows = [t for t in rows if np.isfinite(t)]
        if rows:
            return max(rows)
        files = [t / 1e9 for t in (*self._bank_stamp(), _mtime_ns(self.metrics_path / "metrics.json")) if t]
        return max(files) if files else None

    def ended(self, idle_s: float = 300.0) -> bool:
        """Whether the run has ended: :meth:`finished`, or nothing written for ``idle_s`` seconds."""
        if self.finished():
            return True
        last = self.last_write()
        return last is not None and self.now() - last > idle_s

    def age_reference(self, idle_s: float = 300.0) -> float:
        """The time row ages (staleness) are measured against.

        Now while the run is live; the run's newest write once it has finished (see :meth:`finished`)
        or has written nothing for ``idle_s`` seconds, so a finished run shows the ages its rows had
        when it stopped, not how long ago that was.
        """
        from carls_dask.dashboards.health import reference_time

        return reference_time(self.now(), self.last_write(), self.finished(), idle_s)

    def metrics(self) -> xr.Dataset | None:
        """The metric series (dimension ``step``), loaded into memory; ``None`` when the run has none.

        Re-reads only when the store changed since the last call.
        """
        with self._metrics_lock:
            return self._metrics_read()

    def snapshot(self, version: int, table: str | None = None) -> xr.Dataset:
        """``table`` (default :attr:`table`) as of a committed snapshot version, laid out as
        :func:`carls_dask.storage.open_snapshot` lays it out (cached: snapshots never change).

        Raises
        ------
        UnknownTableError
            If the snapshot has no such table.
        """
        with self._snap_lock:
            return self._snapshot(version, table)

    def latest(self, table: str | None = None) -> xr.Dataset | None:
        """``table`` (default :attr:`table`) as it is now (newest snapshot plus the delta log, through
        :func:`carls_dask.storage.open_bank`), or ``None`` when there is no bank or no such table.

        Re-reads only when the manifest or a delta segment changed.
        """
        with self._latest_lock:
            return self._latest_read(table)

    def headline(self) -> dict[str, float] | None:
        """The bank's headline figures now, over every table: ``rows``, newest ``version``, ``model_step``,
        ``wall_time``, the number of ``snapshots``, and ``rows/TABLE`` for each table; ``None`` when there is
        no committed snapshot yet.

        Cheap enough for every tick, and independent of :meth:`latest` (no lock shared with the plots):
        the newest snapshot's keys and provenance maxima are read once, then only delta-log records
        newer than those already counted are folded in. ``rows`` counts distinct live keys of each table exactly; the
        newest version, step and time are the largest written since the snapshot (a delete does not
        lower them).
        """
        with self._head_lock:
            return self._headline_read()

    def bank_bytes(self) -> dict[str, int] | None:
        """The bank folder's bytes by part (``snapshots``, ``log``, ``other``, ``total``; see
        :func:`carls_dask.storage.bankstore.store_bytes`), or ``None`` when the run has no bank folder.

        Measured again only when the manifest or a delta-log segment changed.
        """
        from carls_dask.storage.bankstore import store_bytes

        if not self.bank_path.is_dir():
            return None
        with self._head_lock:
            stamp = self._bank_stamp()
            if stamp != self._bytes[0] or self._bytes[1] is None:
                try:
                    self._bytes = (stamp, store_bytes(self.bank_path))
                except (StoreError, OSError) as exc:
                    logger.warning("bank store %s not measurable yet: %s", self.bank_path, exc)
                    return None
            return dict(self._bytes[1]) if self._bytes[1] is not None else None

    def truth(self) -> xr.DataArray | None:
        """Held-out labels over ``key`` from ``truth.npz``, or ``None`` when the run has none."""
        with self._truth_lock:
            return self._truth_read()
