"""The pure state machine of one bank shard: rows, key index, provenance, frequencies, optimizer slots.

:class:`ShardCore` is a plain class (no Dask, no I/O): the Dask actor in :mod:`carls_dask.bank.actor`
only wraps it. Every batch is validated in full before anything is changed, so a bad batch leaves the
shard exactly as it was.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.bank.buffers import BufferPool
from carls_dask.bank.dirty import DirtyRows
from carls_dask.bank.hashing import (
    bucket_of_hash,
    mix_seed,
    normal_from_keys,
    splitmix64,
    uniform_from_keys,
)
from carls_dask.bank.keyindex import KeyIndex
from carls_dask.bank.optimizers import STEP_SLOT, apply_optimizer, initial_slots
from carls_dask.bank.rowview import RowView, live_rows
from carls_dask.bank.sampling import NegativeSample, order_by_frequency, sample_candidates
from carls_dask.bank.schema import (
    Column,
    TableSpec,
    check_gradients,
    check_keys,
    check_max_staleness,
    check_sample_size,
    check_top_k_query,
    check_update,
    coerce_column_values,
    unknown_table,
)
from carls_dask.bank.topk import exact_top_k
from carls_dask.storage.errors import (
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidDTypeError,
)

__all__ = ["STATE_FORMAT", "LookupResult", "LookupRows", "ShardCore", "TableState", "gather_rows"]

STATE_FORMAT = 1


@dataclasses.dataclass
class LookupResult:
    """Rows returned by ``lookup``, in the order of the requested keys.

    Attributes
    ----------
    values
        Column name -> ``[n, *shape]`` array; rows of missing keys are zeros.
    found
        ``bool[n]``: whether each key was present (or allocated by ``insert=True``).
    age
        ``float64[n]``: seconds since each row was last written (NaN for missing keys).
    version
        ``int64[n]``: per-row write counter (0 for missing keys).
    model_step
        ``int64[n]``: model step recorded with the last write (-1 for missing keys).
    frequency
        ``int64[n]``: how often each key was looked up with ``insert=True`` (0 for missing keys).
    stale
        ``bool[n]``: rows older than ``max_staleness`` (all False when no bound was given).
    """

    values: dict[str, np.ndarray]
    found: np.ndarray
    age: np.ndarray
    version: np.ndarray
    model_step: np.ndarray
    frequency: np.ndarray
    stale: np.ndarray


#: What a missing key reads in :attr:`LookupRows.meta`: version 0, model step -1, frequency 0, age NaN.
_MISSING_META = np.array([0, -1, 0, np.array(np.nan).view(np.int64)], dtype=np.int64)


@dataclasses.dataclass
class LookupRows:
    """A lookup's answer in the compact form a shard sends it: the values and one provenance array.

    Attributes
    ----------
    values
        Column name -> ``[n, *shape]`` array; rows of missing keys are zeros.
    meta
        ``int64[n, 4]``: version, model step, frequency and age (float64 bits, seconds) of each row;
        ``(0, -1, 0, NaN)`` for a missing key.
    found
        ``bool[n]``, or None when every key was found.
    """

    values: dict[str, np.ndarray]
    meta: np.ndarray
    found: np.ndarray | None

    def result(self, max_staleness: float | None = None) -> LookupResult:
        """The :class:`LookupResult` (its provenance arrays are views of :attr:`meta`)."""
        meta = self.meta
        n = meta.shape[0]
        age = meta[:, 3].view(np.float64)
        found = np.ones(n, dtype=bool) if self.found is None else self.found
        stale = np.zeros(n, dtype=bool) if max_staleness is None else found & (age > float(max_staleness))
        return LookupResult(values=self.values, found=found, age=age, version=meta[:, 0], model_step=meta[:, 1],
                            frequency=meta[:, 2], stale=stale)


def gather_rows(parts: Sequence[tuple[Any, LookupRows]], n: int, specs: Mapping[str, Column],
                max_staleness: float | None = None) -> LookupResult:
    """One :class:`LookupResult` in key order from the answers of several shards.

    Parameters
    ----------
    parts
        ``(positions, rows)`` of each shard: where its keys sit in the batch, and its answer.
    n
        Keys in the batch.
    specs
        The columns answered, by name.
    """
    values = {c: np.empty((n, *col.shape), dtype=col.np_dtype) for c, col in specs.items()}
    meta = np.empty((n, 4), dtype=np.int64)
    found = None
    if any(r.found is not None for _, r in parts):
        found = np.ones(n, dtype=bool)
    for idx, r in parts:
        for c in specs:
            values[c][idx] = r.values[c]
        meta[idx] = r.meta
        if r.found is not None and found is not None:
            found[idx] = r.found
    return LookupRows(values, meta, found).result(max_staleness)


class TableState:
    """Row storage of one table in one shard (arrays grow by ``growth``; row ``i < n`` is live)."""

    def __init__(self, spec: TableSpec, capacity: int, growth: float = 1.5) -> None:
        self.spec = spec
        self.growth = float(growth)
        self.n = 0
        self.cap = max(int(capacity), 1)
        self.bucket = np.zeros(self.cap, dtype=np.int32)
        self.maker = np.zeros(self.cap, dtype=np.int32)
        # key, version, model_step, frequency and wall_time (float64 bits) side by side: the index's key
        # check and the provenance read of a lookup touch the same cache line
        self.meta = np.zeros((self.cap, 5), dtype=np.int64)
        self.cols = {c.name: np.zeros((self.cap, *c.shape), dtype=c.np_dtype) for c in spec.columns}
        self.slots: dict[str, dict[str, np.ndarray]] = {}
        self.index = KeyIndex(self.cap)
        self.seeds = {c.name: mix_seed(spec.name, c.name, spec.seed) for c in spec.columns}
        if spec.optimizer is not None:
            for c in spec.columns:
                if c.is_float:
                    self.ensure_slots(c.name)

    # -- storage ------------------------------------------------------------------------------------
    @property
    def keys(self) -> np.ndarray:
        """Per-row key (a view)."""
        return self.meta[:, 0]

    @property
    def frequency(self) -> np.ndarray:
        """Per-row frequency (a view)."""
        return self.meta[:, 3]

    @property
    def prov(self) -> dict[str, np.ndarray]:
        """Per-row provenance arrays (views; writes go to the table)."""
        return {
            "version": self.meta[:, 1],
            "model_step": self.meta[:, 2],
            "maker": self.maker,
            "wall_time": self.meta[:, 4].view(np.float64),
        }

    def storage(self) -> Iterable[tuple[str, np.ndarray]]:
        """The arrays that hold the rows (grown and moved together)."""
        yield "bucket", self.bucket
        yield "maker", self.maker
        yield "meta", self.meta
        for name, arr in self.cols.items():
            yield f"col/{name}", arr
        for col, slots in self.slots.items():
            for sname, arr in slots.items():
                yield f"slot/{col}/{sname}", arr

    def arrays(self) -> Iterable[tuple[str, np.ndarray]]:
        """Every row-aligned array (views), named as in the exported state."""
        yield "keys", self.keys
        yield "bucket", self.bucket
        yield "frequency", self.frequency
        for name, arr in self.prov.items():
            yield f"prov/{name}", arr
        for name, arr in self.cols.items():
            yield f"col/{name}", arr
        for col, slots in self.slots.items():
            for sname, arr in slots.items():
                yield f"slot/{col}/{sname}", arr

    def _replace(self, name: str, arr: np.ndarray) -> None:
        if name in ("bucket", "maker", "meta"):
            setattr(self, name, arr)
        elif name.startswith("col/"):
            self.cols[name[4:]] = arr
        else:
            _, col, sname = name.split("/")
            self.slots[col][sname] = arr

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` rows in total."""
        if needed <= self.cap:
            return
        new_cap = max(needed, math.ceil(self.cap * self.growth))
        for name, arr in list(self.storage()):
            grown = np.zeros((new_cap, *arr.shape[1:]), dtype=arr.dtype)
            grown[: self.n] = arr[: self.n]
            self._replace(name, grown)
        self.cap = new_cap

    def nbytes(self) -> int:
        """Bytes allocated by the rows (all capacity) and the index."""
        return sum(int(a.nbytes) for _, a in self.storage()) + self.index.nbytes

    def used_bytes(self) -> int:
        """Bytes of the live rows plus the index."""
        return sum(int(a[: self.n].nbytes) for _, a in self.storage()) + self.index.nbytes

    # -- initial values -------------------------------------------------------------------------------
    def initial_values(self, col: Column, keys: np.ndarray) -> np.ndarray:
        """Deterministic initial values of ``col`` for ``keys`` (a function of table, column, key, seed)."""
        spec = self.spec
        kind = col.initializer or (spec.initializer if col.is_float else "zeros")
        scale = float(col.init_scale if col.init_scale is not None else (spec.init_scale or 0.0))
        shape = (keys.shape[0], *col.shape)
        width = max(1, math.prod(col.shape))
        if kind == "zeros":
            return np.zeros(shape, dtype=col.np_dtype)
        if kind == "constant":
            return np.full(shape, scale, dtype=col.np_dtype)
        if kind == "uniform":
            u = uniform_from_keys(keys, self.seeds[col.name], width)
            return ((2.0 * u - 1.0) * scale).reshape(shape).astype(col.np_dtype)
        z = normal_from_keys(keys, self.seeds[col.name], width)
        return (z * scale).reshape(shape).astype(col.np_dtype)

    def ensure_slots(self, column: str) -> dict[str, np.ndarray]:
        """Slot arrays of ``column`` (allocated for all rows on first use)."""
        if column not in self.slots:
            col = self.spec.column(column)
            self.slots[column] = initial_slots(
                self.spec.optimizer, self.cap, col.shape, col.np_dtype, self.spec.adagrad_initial_accumulator
            )
        return self.slots[column]


class ShardCore:
    """One shard of the knowledge bank: tables of typed rows with provenance, all batched.

    Parameters
    ----------
    tables
        Resolved table specs (see :meth:`TableSpec.resolve`).
    shard
        This shard's number.
    n_shards
        Number of shards of the bank.
    buckets
        Number of hash buckets of the bank.
    owned_buckets
        Buckets this shard owns; defaults to ``b % n_shards == shard``.
    initial_capacity
        Rows allocated per table before the first growth.
    clock
        Source of wall time (unix seconds); injectable for tests.
    check_ownership
        Whether batches are checked to hold only keys of owned buckets.
    answer_buffers
        Bytes of large answer arrays kept for reuse (see :class:`~carls_dask.bank.buffers.BufferPool`);
        0 allocates every answer afresh.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        *,
        shard: int = 0,
        n_shards: int = 1,
        buckets: int = 4096,
        owned_buckets: Sequence[int] | None = None,
        initial_capacity: int = 1024,
        clock: Callable[[], float] = time.time,
        check_ownership: bool = True,
        answer_buffers: int = 0,
    ) -> None:
        if not tables:
            raise ValueError("a shard needs at least one table")
        self.shard = int(shard)
        self.n_shards = int(n_shards)
        self.buckets = int(buckets)
        if owned_buckets is None:
            owned = np.arange(self.buckets)[np.arange(self.buckets) % self.n_shards == self.shard]
        else:
            owned = np.unique(np.asarray(owned_buckets, dtype=np.int64))
            if owned.size and (owned.min() < 0 or owned.max() >= self.buckets):
                raise ValueError(f"owned buckets must lie in [0, {self.buckets}), got [{owned.min()}, {owned.max()}]")
        self.owned_buckets = owned.astype(np.int64)
        self._owned_mask = np.zeros(self.buckets, dtype=bool)
        self._owned_mask[self.owned_buckets] = True
        self._owns_all = bool(self._owned_mask.all())
        self.check_ownership = bool(check_ownership)
        self.clock = clock
        self.buffers = BufferPool(answer_buffers)
        self.initial_capacity = int(initial_capacity)
        self.makers: list[str] = [""]
        self._maker_codes: dict[str, int] = {"": 0}
        self.version = 0
        self.tables: dict[str, TableState] = {}
        for spec in tables:
            if not spec.is_resolved:
                raise ValueError(f"table {spec.name!r}: the spec must be resolved before a shard holds it")
            if spec.name in self.tables:
                raise ValueError(f"duplicate table name {spec.name!r}")
            self.tables[spec.name] = TableState(spec, self.initial_capacity)
        # rows changed and keys deleted since the last committed snapshot (incremental snapshots)
        self.dirty: dict[str, DirtyRows] = {name: DirtyRows() for name in self.tables}

    # -- helpers ----------------------------------------------------------------------------------------
    def table(self, name: str) -> TableState:
        """The state of table ``name`` (raises :class:`UnknownTableError`)."""
        try:
            return self.tables[name]
        except (KeyError, TypeError):
            raise unknown_table(str(name), list(self.tables)) from None

    def _keys(self, t: TableState, keys: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Checked keys, their buckets and their ``splitmix64`` hashes (which the key index reuses)."""
        k = check_keys(t.spec.name, keys)
        h = splitmix64(k.view(np.uint64))
        b = bucket_of_hash(h, self.buckets)
        if self.check_ownership and not self._owns_all:
            bad = ~self._owned_mask[b]
            if bad.any():
                raise self._not_owned(t, int(k[int(np.flatnonzero(bad)[0])]))
        return k, b, h

    def _not_owned(self, t: TableState, key: int) -> InvalidBatchError:
        b = int(bucket_of_hash(splitmix64(np.array([key], dtype=np.int64).view(np.uint64)), self.buckets)[0])
        return InvalidBatchError(
            f"table {t.spec.name!r}: key {key} (bucket {b}) is out of range for shard "
            f"{self.shard}, which owns {self.owned_buckets.size} of {self.buckets} buckets"
        )

    def maker_code(self, maker: str) -> int:
        """The int32 code of a maker name (registered on first use)."""
        if not isinstance(maker, str):
            raise InvalidDTypeError(f"maker must be a str, got {type(maker).__name__}")
        code = self._maker_codes.get(maker)
        if code is None:
            code = len(self.makers)
            self.makers.append(maker)
            self._maker_codes[maker] = code
        return code

    def _allocate(
        self,
        t: TableState,
        keys: np.ndarray,
        buckets: np.ndarray,
        now: float,
        hashes: np.ndarray | None = None,
        given: Iterable[str] = (),
    ) -> np.ndarray:
        """Append rows for new unique keys, with initial values; returns their rows.

        Columns named in ``given`` (``col/<name>``, ``slot/<col>/<slot>``) are left for the caller to
        write (a restore writes every column, so computing initial values for them would be wasted).
        """
        skip = set(given)
        m = keys.shape[0]
        t.reserve(t.n + m)
        rows = np.arange(t.n, t.n + m)
        t.meta[rows] = 0
        t.keys[rows] = keys
        t.bucket[rows] = buckets
        t.maker[rows] = 0
        t.prov["wall_time"][rows] = now
        for col in t.spec.columns:
            if f"col/{col.name}" not in skip:
                t.cols[col.name][rows] = t.initial_values(col, keys)
        for cname, slots in t.slots.items():
            if all(f"slot/{cname}/{sname}" in skip for sname in slots):
                continue
            col = t.spec.column(cname)
            fresh = initial_slots(t.spec.optimizer, m, col.shape, col.np_dtype, t.spec.adagrad_initial_accumulator)
            for sname, arr in fresh.items():
                if f"slot/{cname}/{sname}" not in skip:
                    slots[sname][rows] = arr
        t.n += m
        t.index.insert(keys, rows, t.keys, hashes)
        self.dirty[t.spec.name].mark(slice(t.n - m, t.n))
        return rows

    # -- reads ------------------------------------------------------------------------------------------
    def lookup(
        self,
        table: str,
        keys: Any,
        columns: Sequence[str] | None = None,
        insert: bool = False,
        max_staleness: float | None = None,
    ) -> LookupResult:
        """Read rows (and with ``insert=True`` allocate missing keys and count frequency).

        Parameters
        ----------
        table
            Table name.
        keys
            ``int64[n]`` keys; duplicates allowed.
        columns
            Columns to return; all by default.
        insert
            Allocate missing keys with the table's deterministic initializer and add one to the
            frequency of every key for each time it occurs in the batch (CARLS lookup-with-update).
        max_staleness
            Seconds; rows written longer ago are flagged in ``stale``.
        """
        check_max_staleness(table, max_staleness)
        return self.lookup_rows(table, keys, columns, insert).result(max_staleness)

    def lookup_rows(
        self, table: str, keys: Any, columns: Sequence[str] | None = None, insert: bool = False
    ) -> LookupRows:
        """:meth:`lookup` in the compact form a shard sends (see :class:`LookupRows`)."""
        t = self.table(table)
        names = list(t.spec.column_names) if columns is None else [t.spec.column(c).name for c in columns]
        now = self.clock()
        if insert:
            k, b, h = self._keys(t, keys)
            uniq, first, inverse, counts = np.unique(k, return_index=True, return_inverse=True, return_counts=True)
            urows = t.index.find(uniq, t.keys, h[first])
            missing = urows < 0
            if missing.any():
                urows[missing] = self._allocate(t, uniq[missing], b[first[missing]], now, h[first[missing]])
                t.prov["version"][urows[missing]] = 1
            t.frequency[urows] += counts
            self.dirty[t.spec.name].mark(urows)
            self.version += 1
            rows = urows[inverse]
            meta = self.buffers.empty((k.shape[0], 4), np.int64)
            np.take(t.meta[:, 1:], rows, axis=0, out=meta, mode="clip")
        else:
            k = check_keys(t.spec.name, keys)
            rows = np.empty(k.shape[0], dtype=np.int64)
            meta = self.buffers.empty((k.shape[0], 4), np.int64)
            owned = self._owned_mask if self.check_ownership and not self._owns_all else None
            bad = t.index.read(k, t.meta, self.buckets, owned, rows, meta, _MISSING_META)
            if bad >= 0:
                raise self._not_owned(t, int(k[bad]))
        age = meta[:, 3].view(np.float64)
        np.subtract(now, age, out=age)  # wall time -> age (NaN stays NaN)
        found = None if insert else rows >= 0
        if found is not None and found.all():
            found = None
        values = {}
        for name in names:
            col = t.cols[name]
            out = self.buffers.empty((k.shape[0], *col.shape[1:]), col.dtype)
            np.take(col, rows, axis=0, out=out, mode="clip")
            if found is not None:
                out[~found] = 0
            values[name] = out
        return LookupRows(values=values, meta=meta, found=found)

    def contains(self, table: str, keys: Any) -> np.ndarray:
        """``bool[n]``: whether each key is present (frequency untouched)."""
        t = self.table(table)
        k, _, h = self._keys(t, keys)
        return t.index.find(k, t.keys, h) >= 0

    def size(self, table: str | None = None) -> int:
        """Rows in ``table`` (or in all tables)."""
        if table is None:
            return sum(t.n for t in self.tables.values())
        return self.table(table).n

    def keys(self, table: str) -> np.ndarray:
        """All keys of ``table`` (a copy, in row order)."""
        t = self.table(table)
        return t.keys[: t.n].copy()

    def keys_and_frequency(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """Keys of ``table`` with their frequencies (copies)."""
        t = self.table(table)
        return t.keys[: t.n].copy(), t.frequency[: t.n].copy()

    def rows(self, table: str, keys: Any) -> dict[str, np.ndarray]:
        """Full rows (keys, bucket, frequency, prov/*, col/*, slot/*) of the present ``keys``."""
        t = self.table(table)
        k = check_keys(table, keys, allow_empty=True)
        r = t.index.find(k, t.keys)
        r = r[r >= 0]
        return {name: arr[r].copy() for name, arr in t.arrays()}

    # -- writes -----------------------------------------------------------------------------------------
    def update(
        self,
        table: str,
        keys: Any,
        values: Mapping[str, Any],
        *,
        model_step: int = 0,
        maker: str = "",
    ) -> np.ndarray:
        """Write column values (upsert; the last occurrence of a key in the batch wins).

        Missing keys are allocated first (other columns get their initial values). Each written row's
        ``version`` goes up by one and its provenance is set to ``(model_step, maker, now)``.

        Returns
        -------
        numpy.ndarray
            The unique keys written.
        """
        t = self.table(table)
        k, b, h = self._keys(t, keys)
        n = k.shape[0]
        checked = check_update(t.spec, n, values, model_step, maker)
        code = self.maker_code(maker)
        now = self.clock()
        rev_uniq, rev_first = np.unique(k[::-1], return_index=True)
        last = n - 1 - rev_first
        uniq = k[last]
        urows = t.index.find(uniq, t.keys, h[last])
        missing = urows < 0
        if missing.any():
            urows[missing] = self._allocate(t, uniq[missing], b[last[missing]], now, h[last[missing]])
        for name, v in checked.items():
            t.cols[name][urows] = v[last]
        self._touch(t, urows, now, int(model_step), code)
        return rev_uniq

    def _touch(self, t: TableState, rows: np.ndarray, now: float, model_step: int | None, code: int | None) -> None:
        t.prov["version"][rows] += 1
        t.prov["wall_time"][rows] = now
        if model_step is not None:
            t.prov["model_step"][rows] = model_step
        if code is not None:
            t.prov["maker"][rows] = code
        self.dirty[t.spec.name].mark(rows)
        self.version += 1

    def apply_gradients(
        self,
        table: str,
        keys: Any,
        grads: Mapping[str, Any] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
    ) -> np.ndarray:
        """Apply the table's optimizer to the rows of ``keys`` (duplicate keys' gradients are summed).

        Keys that are not in the table are skipped, as in CARLS; the returned mask says which were applied.
        Gradients are cast to the column's compute dtype (see :func:`~carls_dask.bank.optimizers.compute_dtype`)
        and the update runs in it. Each updated row's slots, Adam's per-row ``step`` among them, move one
        step, whatever other rows did: the row alone decides its next update.

        Returns
        -------
        numpy.ndarray
            ``bool[n]``: whether each key's row was present and updated.
        """
        t = self.table(table)
        spec = t.spec
        k, _, h = self._keys(t, keys)
        n = k.shape[0]
        checked, lr = check_gradients(spec, n, grads, column, learning_rate)
        rows = t.index.find(k, t.keys, h)
        found = rows >= 0
        if not found.any():
            return found
        all_found = bool(found.all())
        fk = k if all_found else k[found]
        order = np.argsort(fk, kind="stable")
        sk = fk[order]
        first = np.empty(sk.shape[0], dtype=bool)
        first[0] = True
        np.not_equal(sk[1:], sk[:-1], out=first[1:])
        frows = rows if all_found else rows[found]
        urows = frows[order[first]]
        dupes = not bool(first.all())
        if dupes:
            group = np.cumsum(first) - 1
            rank = np.arange(sk.shape[0]) - np.flatnonzero(first)[group]
        now = self.clock()
        results: list[tuple[str, np.ndarray, dict[str, np.ndarray]]] = []
        for name, g in checked.items():
            gf = g if all_found else g[found]
            summed = np.take(gf, order[first], axis=0)
            if dupes:  # add the 2nd, 3rd, ... occurrence of each key; each level has distinct targets
                for level in range(1, int(rank.max()) + 1):
                    sel = rank == level
                    summed[group[sel]] += np.take(gf, order[sel], axis=0)
            if name in t.slots:
                cur = {s: np.take(a, urows, axis=0) for s, a in t.slots[name].items()}
            else:
                col = spec.column(name)
                cur = initial_slots(spec.optimizer, urows.shape[0], col.shape, col.np_dtype,
                                    spec.adagrad_initial_accumulator)
            new_w, new_slots = apply_optimizer(
                str(spec.optimizer),
                np.take(t.cols[name], urows, axis=0),
                summed,
                cur,
                learning_rate=float(lr),
                betas=spec.adam_betas,
                epsilon=spec.adam_epsilon,
            )
            if not np.isfinite(new_w).all():
                raise InvalidBatchError(
                    f"table {table!r}, column {name!r}: the {spec.optimizer} step would make weights non-finite; "
                    "nothing was changed"
                )
            results.append((name, new_w, new_slots))
        for name, new_w, new_slots in results:
            slots = t.ensure_slots(name)
            t.cols[name][urows] = new_w
            for s, a in new_slots.items():
                slots[s][urows] = a
        self._touch(t, urows, now, None, None)
        return found

    def delete(self, table: str, keys: Any) -> np.ndarray:
        """Remove keys; returns ``bool[n]``, True where the key was present."""
        t = self.table(table)
        k, _, h = self._keys(t, keys)
        rows = t.index.find(k, t.keys, h)
        present = rows >= 0
        dead = np.unique(rows[present])
        if dead.size == 0:
            return present
        n_new = t.n - dead.size
        self.dirty[t.spec.name].deleted(t.keys[dead])
        t.index.remove(t.keys[dead], t.keys)
        tail = np.arange(n_new, t.n)
        movers = tail[~np.isin(tail, dead, assume_unique=True)]
        holes = dead[dead < n_new]
        if movers.size:
            slots, _ = t.index.find_slots(t.keys[movers], t.keys)
            for _name, arr in list(t.storage()):
                arr[holes] = arr[movers]
            t.index.set_rows(slots, holes)
        self.dirty[t.spec.name].moved(holes, movers, n_new)
        t.n = n_new
        if t.index.dead > t.index.live:
            t.index.rebuild(max(t.n, 1), t.keys, None)
        self.version += 1
        return present

    # -- sampling and retrieval --------------------------------------------------------------------------
    def sample_negatives(
        self,
        table: str,
        n: int,
        sampler: str = "uniform",
        unique: bool = True,
        true_keys: Any = None,
        seed: int | None = None,
    ) -> NegativeSample:
        """Sample candidates from this shard's keys (see :func:`carls_dask.bank.sampling.sample_candidates`)."""
        n = check_sample_size(table, n)
        keys, freq = self.keys_and_frequency(table)
        tk = None if true_keys is None else check_keys(table, true_keys, allow_empty=True)
        return sample_candidates(
            table,
            order_by_frequency(keys, freq),
            int(n),
            sampler=sampler,
            unique=unique,
            true_keys=tk,
            rng=np.random.default_rng(seed),
        )

    def top_k(
        self, table: str, query: Any, k: int, column: str = "embedding", metric: str = "dot"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k rows of this shard by dot product or cosine similarity.

        Returns ``(keys[q, k'], scores[q, k'])`` best first (ties: smaller key first), where
        ``k' = min(k, usable rows)`` (rows with a zero norm are not usable under cosine). Large tables
        and query batches use FAISS's exact flat index when ``faiss`` is installed, NumPy otherwise
        (see :func:`carls_dask.bank.topk.exact_top_k`).
        """
        t = self.table(table)
        q = check_top_k_query(t.spec, query, k, column, metric)
        return exact_top_k(t.cols[column][: t.n], t.keys[: t.n], q, int(k), metric, backend="auto")

    # -- state ------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Sizes and memory of each table, and of the answer buffers kept for reuse."""
        pool = self.buffers
        out: dict[str, Any] = {"shard": self.shard, "version": self.version, "tables": {},
                               "answer_buffers": {"bytes": pool.bytes, "reused": pool.reused,
                                                  "allocated": pool.allocated}}
        for name, t in self.tables.items():
            out["tables"][name] = {
                "rows": t.n,
                "capacity": t.cap,
                "bytes_allocated": t.nbytes(),
                "bytes_used": t.used_bytes(),
                "payload_bytes_per_row": t.spec.payload_bytes(),
                "index_bytes": t.index.nbytes,
                "optimizer_steps": {c: int(s[STEP_SLOT][: t.n].max(initial=0)) for c, s in t.slots.items()
                                    if STEP_SLOT in s},
            }
        return out

    def export_state(self) -> dict[str, Any]:
        """The shard's whole state as JSON-able meta plus row-aligned numpy arrays (copies)."""
        meta = self.export_state_meta()
        tables = {name: {a: arr[: t.n].copy() for a, arr in t.arrays()} for name, t in self.tables.items()}
        return {"meta": meta, "tables": tables}

    # -- snapshots without a whole-state copy (see carls_dask.bank.dirty) ----------------------------------
    def state_view(self) -> dict[str, Any]:
        """:meth:`export_state` without the copy: the live rows as views (:func:`~carls_dask.bank.rowview.live_rows`).

        The views are only valid while nothing mutates the shard (the actor holds its lock while a
        snapshot writer reads them chunk by chunk).
        """
        state = self.export_state_meta()
        tables: dict[str, dict[str, np.ndarray | RowView]] = {
            name: {a: live_rows(arr, t.n) for a, arr in t.arrays()} for name, t in self.tables.items()
        }
        return {"meta": state, "tables": tables}

    def export_state_meta(self) -> dict[str, Any]:
        """The ``meta`` part of :meth:`export_state`."""
        return {
            "format": STATE_FORMAT,
            "shard": self.shard,
            "n_shards": self.n_shards,
            "buckets": self.buckets,
            "owned_buckets": [int(b) for b in self.owned_buckets],
            "tables": {name: t.spec.to_json() for name, t in self.tables.items()},
            "makers": list(self.makers),
            "version": self.version,
        }

    def changed_rows(self) -> int:
        """Rows changed (or allocated) since the last snapshot mark, over all tables."""
        return sum(self.dirty[name].count(t.n) for name, t in self.tables.items())

    def freeze_changes(self) -> None:
        """Move the change marks to pending: a snapshot of the current state starts (see :mod:`~carls_dask.bank.dirty`)."""
        for d in self.dirty.values():
            d.freeze()

    def export_changes(self) -> dict[str, Any]:
        """The rows changed and keys deleted since the last committed snapshot (freezing the marks first).

        Returns
        -------
        dict
            ``meta`` as in :meth:`export_state`; ``tables``: per table, the changed rows' full arrays
            (copies, named as in :meth:`export_state`); ``deleted``: per table, ``keys`` (int64) and
            ``bucket`` (int32) deleted since and not present now (a key deleted and inserted again is an
            upsert). Call :meth:`commit_changes` once the snapshot holding them is committed,
            :meth:`rollback_changes` when it is not.
        """
        if not all(d.frozen for d in self.dirty.values()):
            self.freeze_changes()
        tables: dict[str, dict[str, np.ndarray]] = {}
        deleted: dict[str, dict[str, np.ndarray]] = {}
        for name, t in self.tables.items():
            d = self.dirty[name]
            rows = d.frozen_rows(t.n)
            tables[name] = {a: np.asarray(arr[rows]) for a, arr in t.arrays()}
            gone = d.frozen_deleted()
            if gone.size:
                gone = gone[t.index.find(gone, t.keys) < 0]
            deleted[name] = {"keys": gone, "bucket": bucket_of_hash(splitmix64(gone.view(np.uint64)), self.buckets)}
        return {"meta": self.export_state_meta(), "tables": tables, "deleted": deleted}

    def commit_changes(self) -> None:
        """The snapshot that froze the change marks is committed: forget them."""
        for d in self.dirty.values():
            d.commit()

    def rollback_changes(self) -> None:
        """The snapshot that froze the change marks was not committed: they count again."""
        for d in self.dirty.values():
            d.rollback()

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.time,
        initial_capacity: int = 1024,
    ) -> ShardCore:
        """Rebuild a shard from :meth:`export_state` output."""
        meta = state["meta"]
        if meta.get("format") != STATE_FORMAT:
            raise IncompatibleStoreError(f"shard state has format {meta.get('format')!r}; expected {STATE_FORMAT}")
        specs = [TableSpec.from_json(s) for s in meta["tables"].values()]
        core = cls(
            specs,
            shard=meta["shard"],
            n_shards=meta["n_shards"],
            buckets=meta["buckets"],
            owned_buckets=meta["owned_buckets"],
            initial_capacity=initial_capacity,
            clock=clock,
        )
        for name, arrays in state["tables"].items():
            core.import_rows(name, arrays, makers=meta["makers"])
        core.version = int(meta["version"])
        return core

    def import_rows(self, table: str, arrays: Mapping[str, np.ndarray], *, makers: Sequence[str] | None = None) -> int:
        """Upsert full rows (as in the exported state) exactly as given, provenance included.

        Rows of buckets this shard does not own are ignored. Maker codes are translated from
        ``makers`` (the writer's list of maker names) to this shard's codes.

        Returns
        -------
        int
            Rows written.
        """
        t = self.table(table)
        keys = check_keys(table, arrays["keys"], allow_empty=True)
        if keys.size == 0:
            return 0
        h = splitmix64(keys.view(np.uint64))
        buckets = bucket_of_hash(h, self.buckets)
        mine = self._owned_mask[buckets]
        if not mine.all():
            keys = keys[mine]
            arrays = {a: np.asarray(v)[mine] for a, v in arrays.items()}
            buckets = buckets[mine]
            h = h[mine]
        n = keys.shape[0]
        if n == 0:
            return 0
        for name in arrays:
            if name.startswith("col/"):
                coerce_column_values(table, t.spec.column(name[4:]), arrays[name], n)
        rows = t.index.find(keys, t.keys, h)
        missing = rows < 0
        if missing.any():
            given = [a for a in arrays if a.startswith(("col/", "slot/"))]
            rows[missing] = self._allocate(t, keys[missing], buckets[missing], self.clock(), h[missing], given)
        # all new (a restore into an empty table): the rows are one appended range, written as a slice
        at: np.ndarray | slice = slice(int(rows[0]), int(rows[0]) + n) if bool(missing.all()) else rows
        for name, v in arrays.items():
            v = np.asarray(v)
            if name in ("keys", "bucket"):
                continue
            if name == "frequency":
                t.frequency[at] = v
            elif name == "prov/maker":
                names = list(makers) if makers is not None else self.makers
                lut = np.array([self.maker_code(m) for m in names], dtype=np.int32)
                t.prov["maker"][at] = lut[v]
            elif name.startswith("prov/"):
                t.prov[name[5:]][at] = v
            elif name.startswith("col/"):
                t.cols[name[4:]][at] = v
            elif name.startswith("slot/"):
                _, cname, sname = name.split("/")
                t.ensure_slots(cname)[sname][at] = v
        self.dirty[table].mark(at if isinstance(at, slice) else rows)
        return int(n)
