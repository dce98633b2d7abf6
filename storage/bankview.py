"""A bank store as an :class:`xarray.Dataset`: the newest state, or the state as of a past step.

``open_bank(path)`` needs no cluster. When no delta record is newer than the newest snapshot, every
variable except the ``key`` coordinate (and ``maker``, decoded to names) stays lazy: values are read from
the shards' Zarr arrays only when indexed or loaded. Otherwise (or with ``step=``) the snapshot and the
delta-log records after it are merged in memory, last write per key winning.

Variables of a table's dataset: one per column (``embedding`` over ``("key", "dim")``, ...), the
provenance ``version``, ``model_step``, ``maker`` (names), ``wall_time`` (unix seconds), plus
``frequency``, ``bucket``, ``shard`` (the saved shard that held the row, or the shard whose delta log wrote
it last) and the optimizer slots as ``slot_<column>_<slot>``. The merge itself is
:class:`carls_dask.storage.bankstore.BankReplay`, the same replay a bank shard's restore applies.
:func:`open_snapshot` lays out one committed snapshot version the same way (without the delta log after
it): every reader of a bank store (notebooks, the dashboards) gets the same variables and dimensions.

Row order: the lazy view keeps the stored order (shard by shard, by bucket inside a shard); the merged
view is sorted by key. Select rows by label (``ds.sel(key=...)``) rather than by position.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr
import zarr
from xarray.backends import BackendArray
from xarray.core import indexing

from carls_dask.errors import CorruptStoreError, StoreNotFoundError, UnknownTableError
from carls_dask.storage.bankstore import MAKERS_TABLE, BankReplay
from carls_dask.storage.chunkio import open_checked
from carls_dask.storage.deltalog import DeltaRecord, pruned_after, replay
from carls_dask.storage.manifest import (
    delta_seqs,
    entry_at_step,
    is_incremental,
    list_snapshots,
    read_manifest,
    shard_name,
)
from carls_dask.storage.snapshots import read_snapshot

__all__ = ["open_bank", "open_snapshot", "read_bank", "table_columns", "table_order"]

logger = logging.getLogger(__name__)

_PROV = ("version", "model_step", "maker", "wall_time")


class _ShardConcat(BackendArray):
    """Row-wise concatenation of one array across the shards' Zarr stores, read on demand."""

    def __init__(self, arrays: Sequence[zarr.Array], what: str) -> None:
        self.arrays = list(arrays)
        self.what = what
        first = self.arrays[0]
        self.dtype = np.dtype(first.dtype)
        self.shape = (sum(int(a.shape[0]) for a in self.arrays), *first.shape[1:])
        self.bounds = np.cumsum([0] + [int(a.shape[0]) for a in self.arrays])

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.BASIC, self._raw_getitem
        )

    def _raw_getitem(self, key: tuple[Any, ...]) -> np.ndarray:
        rows, rest = key[0], tuple(key[1:])
        if isinstance(rows, int | np.integer):
            start, stop, squeeze = int(rows), int(rows) + 1, True
        else:
            start, stop, step = rows.indices(self.shape[0])
            squeeze = False
            if step != 1:
                return self._raw_getitem((slice(start, stop) if step > 0 else slice(stop + 1, start + 1), *rest))[
                    :: step if step > 0 else -step
                ][:: 1 if step > 0 else -1]
        parts = []
        try:
            for i, a in enumerate(self.arrays):
                lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
                s, e = max(start, lo), min(stop, hi)
                if s < e:
                    parts.append(np.asarray(a[(slice(s - lo, e - lo), *rest)]))
        except Exception as exc:  # zarr reports damaged chunks with assorted errors
            raise CorruptStoreError(f"{self.what}: cannot read rows {start}:{stop}: {exc}") from exc
        if not parts:
            probe = np.zeros((0, *self.shape[1:]), dtype=self.dtype)[(slice(None), *rest)]
            out = probe
        else:
            out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return out[0] if squeeze else out


def _pick_table(man: Mapping[str, Any], table: str | None, root: pathlib.Path) -> str:
    tables = list(man["tables"])
    if table is None:
        if len(tables) != 1:
            raise UnknownTableError(f"bank store {root}: holds tables {tables}; pass table= to choose one")
        return tables[0]
    if table not in man["tables"]:
        raise UnknownTableError(f"bank store {root}: no table {table!r}; tables are {tables}")
    return table


def _merge(batches: BankReplay) -> dict[str, np.ndarray]:
    """Apply the batches in order (last event per key wins); a ``shard`` column says who wrote each row."""
    names: list[str] = []
    chunks: dict[str, list[np.ndarray]] = {}
    ev_keys: list[np.ndarray] = []
    ev_delete: list[np.ndarray] = []
    ev_row: list[np.ndarray] = []
    n_rows = 0
    logged = False
    for batch in batches:
        logged = logged or not batch.from_snapshot or batch.layered  # a key may come more than once
        keys = batch.arrays["keys"]
        ev_keys.append(keys)
        if batch.op == "delete":
            ev_delete.append(np.ones(keys.shape[0], dtype=bool))
            ev_row.append(np.full(keys.shape[0], -1))
            continue
        if batch.from_snapshot and not names:
            names = list(batch.arrays)
            chunks = {k: [] for k in [*names, "shard"]}
        missing = [k for k in names if k not in batch.arrays]
        if missing:
            raise CorruptStoreError(f"delta record {batch.seq} of shard {batch.shard}, table {batch.table!r}, "
                                    f"lacks {missing}; expected full rows")
        for k in names:
            chunks[k].append(batch.arrays[k].astype(chunks[k][0].dtype, copy=False) if chunks[k] else batch.arrays[k])
        chunks["shard"].append(np.full(keys.shape[0], batch.shard, dtype=np.int32))
        ev_delete.append(np.zeros(keys.shape[0], dtype=bool))
        ev_row.append(np.arange(n_rows, n_rows + keys.shape[0]))
        n_rows += keys.shape[0]
    rows = {k: np.concatenate(v) for k, v in chunks.items()}
    if not logged:
        return rows  # snapshot rows only: every key once
    all_keys = np.concatenate(ev_keys)
    delete = np.concatenate(ev_delete)
    row = np.concatenate(ev_row)
    order = np.argsort(all_keys, kind="stable")  # stable: events of one key stay in replay order
    sk = all_keys[order]
    last = np.ones(sk.shape[0], dtype=bool)
    last[:-1] = sk[1:] != sk[:-1]
    pick = order[last]
    take = row[pick[~delete[pick]]]
    return {k: v[take] for k, v in rows.items()}


def read_bank(
    root: str | os.PathLike[str],
    table: str | None = None,
    step: int | None = None,
    *,
    records: Sequence[DeltaRecord] | None = None,
) -> tuple[dict[str, np.ndarray], list[str], dict[str, Any]]:
    """Rows of one table as of ``step`` (newest when None): snapshot plus delta log, sorted by key.

    Parameters
    ----------
    root : path-like
        The bank store.
    table : str, optional
        The table; may be omitted when the bank has one.
    step : int, optional
        The newest snapshot at or before this step plus the delta records up to it.
    records : sequence of DeltaRecord, optional
        The delta records after that snapshot, when the caller has read them already.

    Returns
    -------
    arrays, makers, manifest
        Shard-state-format arrays (plus ``shard``), the maker names that ``prov/maker`` indexes, and
        the manifest of the snapshot used as base.
    """
    rootp = pathlib.Path(root)
    entry = entry_at_step(rootp, step)
    man = read_manifest(rootp, entry["version"])
    tname = _pick_table(man, table, rootp)
    if records is None:
        records = _records_to(rootp, man, entry, step, [tname, MAKERS_TABLE])
    batches = BankReplay(rootp, entry["version"], step=step, tables=[tname], records=records)
    rows = _merge(batches)
    order = np.argsort(rows["keys"], kind="stable")
    return {k: v[order] for k, v in rows.items()}, list(batches.makers), man


def _dims_for(man: Mapping[str, Any], table: str, arrays: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Dimension names of every column (from the table spec), renamed where sizes would clash."""
    spec = man.get("meta", {}).get("tables", {}).get(table)
    if spec is None:
        for info in man["shards"].values():
            spec = info["meta"].get("tables", {}).get(table)
            if spec:
                break
    declared = {c["name"]: tuple(c.get("dims", ())) for c in (spec or {}).get("columns", [])}
    out: dict[str, tuple[str, ...]] = {}
    sizes: dict[str, int] = {}
    for name, desc in arrays.items():
        if not name.startswith("col/"):
            continue
        col = name[4:]
        shape = list(desc["shape"])
        dims = declared.get(col, ())
        if len(dims) != len(shape):
            dims = tuple(f"{col}_dim{i}" if i else f"{col}_dim" for i in range(len(shape)))
        fixed = []
        for d, n in zip(dims, shape, strict=True):
            if sizes.setdefault(d, n) != n:
                d = f"{col}_{d}"
                sizes[d] = n
            fixed.append(d)
        out[col] = tuple(fixed)
    return out


def _var_name(name: str) -> str:
    if name.startswith("col/") or name.startswith("prov/"):
        return name.split("/", 1)[1]
    if name.startswith("slot/"):
        _, col, slot = name.split("/")
        return f"slot_{col}_{slot}"
    return name


def _build(
    man: Mapping[str, Any],
    table: str,
    keys: np.ndarray,
    data: Mapping[str, Any],
    makers: Sequence[str],
    maker_codes: np.ndarray,
    attrs: dict[str, Any],
) -> xr.Dataset:
    arrays = man["tables"][table]["arrays"]
    dims = _dims_for(man, table, arrays)
    variables: dict[str, Any] = {}
    for name, value in data.items():
        if name in ("keys", "prov/maker"):
            continue
        var = _var_name(name)
        if name.startswith("col/"):
            d: tuple[str, ...] = ("key", *dims[name[4:]])
        elif name.startswith("slot/"):
            col = name.split("/")[1]
            ndim = len(arrays[name]["shape"])  # a per-row slot (Adam's step) has none of the column's dims
            own = dims.get(col, ())
            d = ("key", *(own if len(own) == ndim else tuple(f"{var}_dim{i}" for i in range(ndim))))
        else:
            d = ("key",)
        if var in variables:
            var = name.replace("/", "_")
        variables[var] = xr.Variable(d, value, attrs={"units": "unix seconds"} if var == "wall_time" else None)
    names = np.asarray([*makers, ""], dtype=str)
    codes = np.where((maker_codes >= 0) & (maker_codes < len(makers)), maker_codes, len(makers))
    variables["maker"] = xr.Variable(("key",), names[codes])
    return xr.Dataset(variables, coords={"key": keys}, attrs=attrs)


def _records_to(root: pathlib.Path, man: Mapping[str, Any], entry: Mapping[str, Any], step: int | None,
                tables: list[str]) -> list[DeltaRecord]:
    """The delta records after snapshot ``man`` up to ``step``; a step past the newest the store holds is an error.

    When a newer snapshot truncated the log after ``man`` (``carls.storage.log-history: newest``), the snapshot's
    own step reads as the snapshot and a step between it and the next kept snapshot is an error naming the
    steps that can be read.
    """
    since = delta_seqs(man)
    if pruned_after(root, since):
        if step == int(entry["step"]):
            return []
        kept = [int(e["step"]) for e in list_snapshots(root)]
        raise StoreNotFoundError(
            f"bank store {root}: step {step} falls between kept snapshots, and the delta log between them was "
            f"removed when a newer snapshot truncated the log (carls.storage.log-history: newest); expected a kept "
            f"snapshot's step {kept} or a step from the newest on, or carls.storage.log-history: kept for step-exact "
            "reads")
    if step is None or step <= int(entry["step"]) or list_snapshots(root)[-1]["version"] != entry["version"]:
        return list(replay(root, since_seq=since, until_step=step, tables=tables))
    records = list(replay(root, since_seq=since, tables=tables))
    newest = max([int(entry["step"]), *(int(r.step) for r in records)])
    if step > newest:
        raise StoreNotFoundError(f"bank store {root}: step {step} is past the newest step it holds, {newest} (newest "
                                 f"snapshot v{int(entry['version'])} at step {int(entry['step'])}, then the delta log); "
                                 f"expected a step <= {newest}, or none for the newest state")
    return [r for r in records if r.step <= step]


def table_order(man: Mapping[str, Any]) -> list[str]:
    """The tables of a snapshot manifest in the order the bank was created with them.

    The order a paradigm's ``tables()`` or :meth:`KnowledgeBank.create <carls_dask.bank.KnowledgeBank.create>`
    gave them (``meta.table_order``, kept by :func:`~carls_dask.storage.snapshots.commit_snapshot`), then any
    other table the snapshot holds, by name.
    """
    declared = [str(t) for t in man.get("meta", {}).get("table_order", [])]
    held = [str(t) for t in man.get("tables", {})]
    return [t for t in declared if t in held] + sorted(t for t in held if t not in declared)


def table_columns(man: Mapping[str, Any], table: str) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """The columns of ``table`` in a snapshot manifest: name to (dtype, shape of one row), in the table spec's order.

    Columns the spec does not list (a manifest written without specs) follow, by name. Empty for a
    table the snapshot does not hold.
    """
    arrays = man.get("tables", {}).get(table, {}).get("arrays", {})
    held = {name[4:]: (np.dtype(d["dtype"]), tuple(int(n) for n in d["shape"]))
            for name, d in arrays.items() if name.startswith("col/")}
    spec: Mapping[str, Any] = man.get("meta", {}).get("tables", {}).get(table) or next(
        (info.get("meta", {}).get("tables", {}).get(table) for info in man.get("shards", {}).values()
         if info.get("meta", {}).get("tables", {}).get(table)), {})
    order = [str(c["name"]) for c in spec.get("columns", []) if c.get("name") in held]
    return {c: held[c] for c in [*order, *sorted(c for c in held if c not in order)]}


def open_snapshot(path: str | os.PathLike[str], version: int, table: str | None = None, *,
                  slots: bool = True) -> xr.Dataset:
    """One committed snapshot version of a table as an in-memory :class:`xarray.Dataset`; no cluster needed.

    The same variables, dimensions and attributes as :func:`open_bank` (rows sorted by key), of the
    rows the snapshot holds: an incremental snapshot is folded onto the versions it builds on, and no
    delta-log record written after it is applied. Snapshots never change, so a reader may cache the
    result by version.

    Parameters
    ----------
    path : path-like
        The bank store folder.
    version : int
        A committed snapshot version (see :func:`~carls_dask.storage.manifest.list_snapshots`).
    table : str, optional
        The table; may be omitted when the bank has one.
    slots : bool
        Keep the optimizer slots (``slot_<column>_<slot>``); False leaves them out (a viewer's cache).

    Raises
    ------
    StoreNotFoundError, IncompatibleStoreError, CorruptStoreError
        Missing store or version, another format version, damaged data.
    UnknownTableError
        If ``table`` is not in the snapshot (or is needed and missing).
    """
    rootp = pathlib.Path(path)
    man = read_manifest(rootp, int(version))
    tname = _pick_table(man, table, rootp)
    batches = BankReplay(rootp, int(version), replay_log=False, tables=[tname])
    rows = _merge(batches)
    order = np.argsort(rows["keys"], kind="stable")
    rows = {k: v[order] for k, v in rows.items() if slots or not k.startswith("slot/")}
    attrs: dict[str, Any] = {
        "table": tname,
        "version": int(man["version"]),
        "step": int(man["step"]),
        "snapshot_step": int(man["step"]),
        "n_shards": int(man["n_shards"]),
        "buckets": int(man["buckets"]),
        "spec": json.dumps(man.get("meta", {}).get("tables", {}).get(tname, {})),
        "meta": json.dumps(man.get("meta", {})),
        "makers": list(batches.makers),
        "delta": 0,
    }
    return _build(man, tname, rows["keys"], rows, batches.makers, rows["prov/maker"], attrs)


def open_bank(path: str | os.PathLike[str], step: int | None = None, table: str | None = None) -> xr.Dataset:
    """Open a bank store (``RUN/bank``) as an :class:`xarray.Dataset`; no cluster needed.

    Parameters
    ----------
    path : path-like
        The bank store folder.
    step : int, optional
        Read the bank as of this step: the newest snapshot at or before it plus the delta-log records
        up to it. None reads the newest state.
    table : str, optional
        The table to open; may be omitted when the bank has one table.

    Returns
    -------
    xarray.Dataset
        Dims ``key`` plus the columns' own (``dim``, ``class``, ...); attrs ``table``, ``version``,
        ``step`` (of the base snapshot, or the requested step), ``n_shards``, ``buckets``, ``makers`` and
        ``spec``/``meta`` (JSON strings).

    Raises
    ------
    StoreNotFoundError, IncompatibleStoreError, CorruptStoreError
        Missing store or snapshot, a ``step`` past the newest one the store holds (the message names
        it), other format version, damaged data.
    UnknownTableError
        If ``table`` is not in the bank (or is needed and missing).
    """
    rootp = pathlib.Path(path)
    entry = entry_at_step(rootp, step)
    man = read_manifest(rootp, entry["version"])
    tname = _pick_table(man, table, rootp)
    attrs: dict[str, Any] = {
        "table": tname,
        "version": int(man["version"]),
        "step": int(man["step"] if step is None else step),
        "snapshot_step": int(man["step"]),
        "n_shards": int(man["n_shards"]),
        "buckets": int(man["buckets"]),
        "spec": json.dumps(man.get("meta", {}).get("tables", {}).get(tname, {})),
        "meta": json.dumps(man.get("meta", {})),
    }
    records = _records_to(rootp, man, entry, step, [tname, MAKERS_TABLE])
    if any(r.table == tname for r in records) or is_incremental(man):
        rows, makers, _ = read_bank(rootp, tname, step, records=records)
        attrs["makers"] = list(makers)
        attrs["delta"] = 1
        return _build(man, tname, rows["keys"], rows, makers, rows["prov/maker"], attrs)
    # lazy: keys and maker codes are read now; every other variable on access
    small = read_snapshot(rootp, entry["version"], tables=[tname], names=["prov/maker"])[tname]
    vdir = rootp / man["path"]
    groups = [
        zarr.open_group(str(vdir / f"{shard_name(int(s))}.zarr"), mode="r", zarr_format=3) for s in man["shards"]
    ]
    data: dict[str, Any] = {}
    for name in man["tables"][tname]["arrays"]:
        if name in ("keys", "prov/maker"):
            continue
        zs = []
        for g in groups:
            zs.append(open_checked(g, f"{tname}/{name}"))  # numeric arrays with the writer's codecs only
        data[name] = indexing.LazilyIndexedArray(_ShardConcat(zs, f"bank store {rootp}, {tname}/{name}"))
    data["shard"] = np.concatenate(
        [np.full(info["tables"][tname]["rows"], int(s), dtype=np.int32) for s, info in man["shards"].items()]
    )
    attrs["makers"] = list(man["makers"])
    attrs["delta"] = 0
    return _build(man, tname, small["keys"], data, man["makers"], small["prov/maker"], attrs)
