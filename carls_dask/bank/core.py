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

from carls_dask.bank import stages
from carls_dask.bank.ann import METHODS, AnnIndex, AnnSettings
from carls_dask.bank.batchpass import dedupe, hash_keys, put_rows, touch_rows
from carls_dask.bank.bounds import TableBounds, choose_victims, expired_rows, low_water, victim_scores
from carls_dask.bank.buffers import BufferPool
from carls_dask.bank.changes import ChangeFeed, new_epoch
from carls_dask.bank.dirty import DirtyRows
from carls_dask.bank.gradsum import group_by_row, sum_by_row
from carls_dask.bank.hashing import bucket_of_hash, mix_seed, splitmix64
from carls_dask.bank.initializers import initial_block
from carls_dask.bank.keyindex import KeyIndex
from carls_dask.bank.optimizers import STEP_SLOT, apply_optimizer, initial_slots
from carls_dask.bank.rowstep import StepPlan, plan_step
from carls_dask.bank.rowview import RowView, live_rows
from carls_dask.bank.sampling import NegativeSample
from carls_dask.bank.schema import (
    Column,
    TableSpec,
    check_counts,
    check_gradients,
    check_keys,
    check_learning_rate,
    check_max_staleness,
    check_sample_size,
    check_top_k_query,
    check_update,
    coerce_column_values,
    unknown_table,
)
from carls_dask.bank.segments import SegmentedArray
from carls_dask.bank.shard_sampler import (
    RankOrder,
    SamplingSettings,
    ShardDraw,
    describe,
    draw_from_shard,
    expected_counts,
)
from carls_dask.bank.topk import exact_top_k
from carls_dask.errors import (
    ConfigError,
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidDTypeError,
)

__all__ = ["STATE_FORMAT", "LookupResult", "LookupRows", "ShardCore", "TableState", "Written", "gather_rows"]

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
    rejected
        ``bool[n]``: keys a bounded table refused a row (not admitted yet, or evicted by the cap within
        the same batch); they are also not ``found``. All False for other tables and reads.
    """

    values: dict[str, np.ndarray]
    found: np.ndarray
    age: np.ndarray
    version: np.ndarray
    model_step: np.ndarray
    frequency: np.ndarray
    stale: np.ndarray
    rejected: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Written:
    """The distinct rows (positions in the table) a write changed, as the write returns them for the delta log."""

    table: str
    rows: np.ndarray


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
    rejected
        ``bool[n]`` keys a bounded table refused a row (see :class:`LookupResult`), or None when none was.
    """

    values: dict[str, np.ndarray]
    meta: np.ndarray
    found: np.ndarray | None
    rejected: np.ndarray | None = None

    def result(self, max_staleness: float | None = None) -> LookupResult:
        """The :class:`LookupResult` (its provenance arrays are views of :attr:`meta`)."""
        meta = self.meta
        n = meta.shape[0]
        age = meta[:, 3].view(np.float64)
        found = np.ones(n, dtype=bool) if self.found is None else self.found
        stale = np.zeros(n, dtype=bool) if max_staleness is None else found & (age > float(max_staleness))
        rejected = np.zeros(n, dtype=bool) if self.rejected is None else self.rejected
        return LookupResult(values=self.values, found=found, age=age, version=meta[:, 0], model_step=meta[:, 1],
                            frequency=meta[:, 2], stale=stale, rejected=rejected)


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
    rejected = None
    if any(r.rejected is not None for _, r in parts):
        rejected = np.zeros(n, dtype=bool)
    for idx, r in parts:
        for c in specs:
            put_rows(values[c], idx, r.values[c])
        put_rows(meta, idx, r.meta)
        if r.found is not None and found is not None:
            found[idx] = r.found
        if r.rejected is not None and rejected is not None:
            rejected[idx] = r.rejected
    return LookupRows(values, meta, found, rejected).result(max_staleness)


def _copy_rows(arr: np.ndarray | SegmentedArray, n: int) -> np.ndarray:
    """A copy of the first ``n`` rows (a segmented array's slice is a copy already)."""
    return arr[:n] if isinstance(arr, SegmentedArray) else arr[:n].copy()


class TableState:
    """Row storage of one table in one shard (row ``i < n`` is live).

    Column values and optimizer slots (``cols``, ``slots``) are :class:`~carls_dask.bank.segments.SegmentedArray`
    s: they grow by fixed-size segments and never move old rows. The narrow per-row arrays (``meta``,
    ``bucket``, ``maker``) are contiguous and grow by ``growth``.
    """

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
        self.cols = {c.name: SegmentedArray(c.shape, c.np_dtype, self.cap) for c in spec.columns}
        self.slots: dict[str, dict[str, SegmentedArray]] = {}
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

    def storage(self) -> Iterable[tuple[str, np.ndarray | SegmentedArray]]:
        """The arrays that hold the rows (grown and moved together)."""
        yield "bucket", self.bucket
        yield "maker", self.maker
        yield "meta", self.meta
        for name, seg in self.cols.items():
            yield f"col/{name}", seg
        for col, slots in self.slots.items():
            for sname, sseg in slots.items():
                yield f"slot/{col}/{sname}", sseg

    def arrays(self) -> Iterable[tuple[str, np.ndarray | SegmentedArray]]:
        """Every row-aligned array (views), named as in the exported state."""
        yield "keys", self.keys
        yield "bucket", self.bucket
        yield "frequency", self.frequency
        for name, arr in self.prov.items():
            yield f"prov/{name}", arr
        for name, seg in self.cols.items():
            yield f"col/{name}", seg
        for col, slots in self.slots.items():
            for sname, sseg in slots.items():
                yield f"slot/{col}/{sname}", sseg

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` rows in total (segmented storage grows by segments, the rest by ``growth``)."""
        for _, arr in self.storage():
            if isinstance(arr, SegmentedArray):
                arr.reserve(needed)
        if needed <= self.cap:
            return
        new_cap = max(needed, math.ceil(self.cap * self.growth))
        for name in ("bucket", "maker", "meta"):
            arr = getattr(self, name)
            grown = np.zeros((new_cap, *arr.shape[1:]), dtype=arr.dtype)
            grown[: self.n] = arr[: self.n]
            setattr(self, name, grown)
        self.cap = new_cap

    def nbytes(self) -> int:
        """Bytes allocated by the rows (all capacity, every segment) and the index."""
        return sum(int(a.nbytes) for _, a in self.storage()) + self.index.nbytes

    def used_bytes(self) -> int:
        """Bytes of the live rows plus the index."""
        per_row = sum(int(a.nbytes) // max(1, len(a)) for _, a in self.storage())
        return per_row * self.n + self.index.nbytes

    # -- initial values -------------------------------------------------------------------------------
    def initial_values(self, col: Column, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Deterministic initial values of ``col`` for ``keys`` (a function of table, column, key, seed), into
        ``out`` (``[n, *shape]`` of the column's dtype, C-contiguous) when given."""
        spec = self.spec
        kind = col.initializer or (spec.initializer if col.is_float else "zeros")
        scale = float(col.init_scale if col.init_scale is not None else (spec.init_scale or 0.0))
        shape = (keys.shape[0], *col.shape)
        if kind in ("zeros", "constant"):
            value = 0 if kind == "zeros" else scale
            if out is None:
                return np.full(shape, value, dtype=col.np_dtype)
            out[...] = value
            return out
        return initial_block(str(kind), keys, self.seeds[col.name], col.shape, scale, col.np_dtype, out=out)

    def fill_initial(self, col: Column, keys: np.ndarray, start: int) -> None:
        """Write the initial values of ``col`` for ``keys`` into rows ``start..start + len(keys)`` where they live
        (segment by segment, without a batch-sized temporary)."""
        for first, part in self.cols[col.name].chunks(start + keys.shape[0], start):
            self.initial_values(col, keys[first - start: first - start + part.shape[0]], out=part)

    def ensure_slots(self, column: str) -> dict[str, SegmentedArray]:
        """Slot arrays of ``column`` (allocated on first use, the live rows given their initial slots)."""
        if column not in self.slots:
            col = self.spec.column(column)
            fresh = initial_slots(self.spec.optimizer, self.n, col.shape, col.np_dtype,
                                  self.spec.adagrad_initial_accumulator)
            cap = len(self.cols[column])
            slots = {}
            for sname, arr in fresh.items():
                seg = SegmentedArray(arr.shape[1:], arr.dtype, cap)
                seg[: self.n] = arr
                slots[sname] = seg
            self.slots[column] = slots
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
    sampling
        When the frequency-rank order of ``log_uniform`` sampling is rebuilt
        (see :mod:`carls_dask.bank.shard_sampler`); defaults to :class:`SamplingSettings` ``()``.
    ann
        Shape and upkeep of the IVF indexes of ``top_k(method="ivf")`` (see :mod:`carls_dask.bank.ann`).
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
        sampling: SamplingSettings | None = None,
        ann: AnnSettings | None = None,
    ) -> None:
        if not tables:
            raise ConfigError("a shard needs at least one table")
        self.shard = int(shard)
        self.n_shards = int(n_shards)
        self.buckets = int(buckets)
        if owned_buckets is None:
            owned = np.arange(self.buckets)[np.arange(self.buckets) % self.n_shards == self.shard]
        else:
            owned = np.unique(np.asarray(owned_buckets, dtype=np.int64))
            if owned.size and (owned.min() < 0 or owned.max() >= self.buckets):
                raise ConfigError(f"owned buckets must lie in [0, {self.buckets}), got [{owned.min()}, {owned.max()}]")
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
        self.sampling = sampling if sampling is not None else SamplingSettings()
        self._rank_orders: dict[str, RankOrder] = {}
        self.ann = ann if ann is not None else AnnSettings()
        self._ann: dict[tuple[str, str, str], AnnIndex] = {}
        for spec in tables:
            if not spec.is_resolved:
                raise ConfigError(f"table {spec.name!r}: the spec must be resolved before a shard holds it")
            if spec.name in self.tables:
                raise ConfigError(f"duplicate table name {spec.name!r}")
            self.tables[spec.name] = TableState(spec, self.initial_capacity)
        #: Bounds of the bounded tables (row cap, admission, TTL; see :mod:`carls_dask.bank.bounds`).
        self.bounds: dict[str, TableBounds] = {
            s.name: b for s in tables if (b := TableBounds.for_spec(s)) is not None
        }
        # rows changed and keys deleted since the last committed snapshot (incremental snapshots)
        self.dirty: dict[str, DirtyRows] = {name: DirtyRows() for name in self.tables}
        #: Change feeds of the watched columns, by table and column (see :mod:`carls_dask.bank.changes`).
        self.feeds: dict[str, dict[str, ChangeFeed]] = {
            s.name: {w.column: ChangeFeed(w, s.column(w.column).shape, s.column(w.column).np_dtype) for w in s.watch}
            for s in tables if s.watch
        }
        #: Epoch of this shard's feeds: new whenever a shard's state is built (a cursor of another epoch sees all rows).
        self.feed_epoch = new_epoch()

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
        h, b, bad = hash_keys(k, self.buckets, self._owned_mask if self.check_ownership and not self._owns_all else None)
        if bad >= 0:
            raise self._not_owned(t, int(k[bad]))
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
        at = slice(t.n, t.n + m)
        for col in t.spec.columns:
            if f"col/{col.name}" not in skip:
                t.fill_initial(col, keys, t.n)
        for cname, slots in t.slots.items():
            col = t.spec.column(cname)
            fresh = initial_slots(t.spec.optimizer, 1, col.shape, col.np_dtype, t.spec.adagrad_initial_accumulator)
            for sname, one in fresh.items():  # every new row starts from the same slot values
                if f"slot/{cname}/{sname}" not in skip:
                    slots[sname][at] = one[0]
        t.n += m
        t.index.insert(keys, rows, t.keys, hashes)
        if self._ann:
            self._ann_touch(t, keys)
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
            In a bounded table (see :mod:`carls_dask.bank.bounds`) a key refused a row is not ``found``
            and is flagged ``rejected``.
        max_staleness
            Seconds; rows written longer ago are flagged in ``stale``.
        """
        check_max_staleness(table, max_staleness)
        return self.lookup_rows(table, keys, columns, insert).result(max_staleness)

    def lookup_rows(
        self, table: str, keys: Any, columns: Sequence[str] | None = None, insert: bool = False,
        counts: np.ndarray | None = None,
    ) -> LookupRows:
        """:meth:`lookup` in the compact form a shard sends (see :class:`LookupRows`).

        ``counts`` (with ``insert``): how much each key adds to its frequency, instead of one per occurrence.
        """
        return self.lookup_rows_wrote(table, keys, columns, insert, counts)[0]

    def lookup_rows_wrote(
        self, table: str, keys: Any, columns: Sequence[str] | None = None, insert: bool = False,
        counts: np.ndarray | None = None,
    ) -> tuple[LookupRows, Written | None]:
        """:meth:`lookup_rows`, and the rows an insert wrote (allocations and frequencies; None for a read)."""
        t = self.table(table)
        written = None
        names = list(t.spec.column_names) if columns is None else [t.spec.column(c).name for c in columns]
        now = self.clock()
        rejected = None
        if insert:
            k, b, h = self._keys(t, keys)
            stages.mark("shard", "key check and hashing")
            bnd = self.bounds.get(t.spec.name)
            if bnd is not None and bnd.ttl_due(now):
                self._expire(t, bnd, now)
            given = None if counts is None else check_counts(table, counts, k.shape[0])
            first, inverse, counts = dedupe(k, h)
            if given is not None:  # each key adds what the caller counted for it (summed over repeats)
                counts = np.bincount(inverse, weights=given, minlength=first.shape[0]).astype(np.int64)
            uniq = k[first]
            stages.mark("shard", "dedupe")
            urows = t.index.find(uniq, t.keys, h[first])
            missing = urows < 0
            stages.mark("shard", "index probe")
            est = None
            if bnd is not None:
                missing, est = bnd.admit(uniq, counts, missing)
            if missing.any():
                urows[missing] = self._allocate(t, uniq[missing], b[first[missing]], now, h[first[missing]])
                t.prov["version"][urows[missing]] = 1
            stages.mark("shard", "allocation")
            if bnd is None:
                t.frequency[urows] += counts
            else:
                urows = self._bounded_insert(t, bnd, uniq, h[first], counts, urows, missing, est, now)
                if (urows < 0).any():
                    rejected = (urows < 0)[inverse]
            stages.mark("shard", "provenance")
            wrote = urows[urows >= 0] if rejected is not None else urows
            self._mark(t, wrote)
            written = Written(t.spec.name, wrote)
            if (order := self._rank_orders.get(table)) is not None:
                order.note_changes(uniq.size)
            self.version += 1
            stages.mark("shard", "change marks")
            rows = urows[inverse]
            meta = self.buffers.empty((k.shape[0], 4), np.int64)
            # from the contiguous rows (a take from the column view t.meta[:, 1:] would copy the whole table first)
            meta[...] = np.take(t.meta, rows, axis=0, mode="clip")[:, 1:]
            if rejected is not None:
                meta[rejected] = _MISSING_META
        else:
            k = check_keys(t.spec.name, keys)
            stages.mark("shard", "key check and hashing")
            rows = np.empty(k.shape[0], dtype=np.int64)
            meta = self.buffers.empty((k.shape[0], 4), np.int64)
            owned = self._owned_mask if self.check_ownership and not self._owns_all else None
            bad = t.index.read(k, t.meta, self.buckets, owned, rows, meta, _MISSING_META)
            if bad >= 0:
                raise self._not_owned(t, int(k[bad]))
            stages.mark("shard", "index probe")
        age = meta[:, 3].view(np.float64)
        np.subtract(now, age, out=age)  # wall time -> age (NaN stays NaN)
        found = (None if rejected is None else ~rejected) if insert else rows >= 0
        if found is not None and found.all():
            found = None
        stages.mark("shard", "provenance")
        values = {}
        for name in names:
            col = t.cols[name]
            out = self.buffers.empty((k.shape[0], *col.shape[1:]), col.dtype)
            col.take(rows, out=out)
            if found is not None:
                out[~found] = 0
            values[name] = out
        stages.mark("shard", "gather")
        return LookupRows(values=values, meta=meta, found=found, rejected=rejected), written

    # -- bounded tables (see carls_dask.bank.bounds) ----------------------------------------------------
    def _bounded_insert(self, t: TableState, bnd: TableBounds, uniq: np.ndarray, hashes: np.ndarray,
                        counts: np.ndarray, urows: np.ndarray, new: np.ndarray, est: np.ndarray | None,
                        now: float) -> np.ndarray:
        """Count a lookup-with-insert batch in a bounded table and evict to its cap; returns the rows (-1: none)."""
        have = urows >= 0
        rows = urows[have]
        t.frequency[rows] += counts[have]
        if est is not None and new.any():  # a newly admitted row starts at its sightings so far
            t.frequency[urows[new]] = est[new]
        if t.spec.eviction == "lru":
            t.prov["wall_time"][rows] = now
        if self._enforce_cap(t, bnd, None):  # the batch's rows compete too (LFU: a new key must beat the least used)
            urows = t.index.find(uniq, t.keys, hashes)
        return urows

    def _enforce_cap(self, t: TableState, bnd: TableBounds, protect: np.ndarray | None) -> bool:
        """Evict down to the low-water mark when over ``max_rows`` (``protect`` rows last); whether it did."""
        cap = t.spec.max_rows
        if cap is None or t.n <= cap:
            return False
        n = t.n
        scores = victim_scores(t.spec.eviction, t.frequency[:n], t.prov["wall_time"][:n])
        victims = choose_victims(scores, t.keys[:n], n - low_water(cap), protect)
        self._evict(t, bnd, victims, "cap")
        return True

    def _evict(self, t: TableState, bnd: TableBounds, rows: np.ndarray, reason: str) -> None:
        if rows.size == 0:
            return
        keys = t.keys[rows].copy()
        self.delete(t.spec.name, keys)
        bnd.note_evicted(keys, reason)

    def _expire(self, t: TableState, bnd: TableBounds, now: float) -> int:
        bnd.last_sweep = now
        if t.spec.ttl is None:
            return 0
        rows = expired_rows(t.prov["wall_time"][: t.n], now, t.spec.ttl)
        self._evict(t, bnd, rows, "ttl")
        return int(rows.size)

    def expire(self, table: str) -> int:
        """Evict the rows of ``table`` past its ``ttl`` now; returns how many (0 for a table without one)."""
        t = self.table(table)
        bnd = self.bounds.get(t.spec.name)
        if bnd is None:
            return 0
        return self._expire(t, bnd, self.clock())

    def record_evictions(self, on: bool = True) -> None:
        """Keep evicted keys for :meth:`take_evicted` (the actor logs them as deletes)."""
        for bnd in self.bounds.values():
            bnd.record = bool(on)
            if not on:
                bnd.evicted.clear()

    def take_evicted(self, table: str) -> np.ndarray:
        """Keys of ``table`` evicted since the last call (recorded only after :meth:`record_evictions`)."""
        bnd = self.bounds.get(self.table(table).spec.name)
        return np.zeros(0, dtype=np.int64) if bnd is None else bnd.take_evicted()

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
        return self.row_arrays(table, r[r >= 0])

    def row_arrays(self, table: str, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Full rows (as :meth:`rows`) of row numbers ``rows`` (each below the table's size)."""
        t = self.table(table)
        # indexing, not take: the narrow arrays are column views of the provenance block, which np.take would
        # copy whole before gathering
        return {name: arr[rows] if isinstance(arr, np.ndarray) else arr.take(rows) for name, arr in t.arrays()}

    def _mark(self, t: TableState, rows: np.ndarray | slice) -> None:
        """Rows ``rows`` were written: mark them for the next snapshot and feed the table's change feeds."""
        self.dirty[t.spec.name].mark(rows)
        self._feed(t, rows)

    def _feed(self, t: TableState, rows: np.ndarray | slice) -> None:
        """Tell the table's change feeds that ``rows`` were written."""
        feeds = self.feeds.get(t.spec.name)
        if feeds:
            r = np.arange(rows.start, rows.stop, dtype=np.int64) if isinstance(rows, slice) else np.asarray(rows)
            for column, feed in feeds.items():
                feed.written(r, np.asarray(t.cols[column][r]))

    # -- change feeds -----------------------------------------------------------------------------------
    def changes(
        self, table: str, column: str, since: tuple[str, int] | None = None, limit: int | None = None
    ) -> tuple[np.ndarray, tuple[str, int], bool]:
        """Keys whose ``column`` moved after ``since`` (this shard's ``(epoch, sequence number)``).

        A ``since`` of another epoch (or ``None``) answers every present key. Returns the keys, the
        position to ask from next time and whether the answer is complete (``limit`` may cut it).
        """
        t = self.table(table)
        feed = self.feeds.get(table, {}).get(column)
        if feed is None:
            watched = [w.column for w in t.spec.watch]
            raise InvalidBatchError(f"table {table!r}: column {column!r} is not watched; watched columns: {watched}")
        seq: int | None = None
        if since is not None and since[0] == self.feed_epoch:
            seq = int(since[1])
            if not 0 <= seq <= feed.seq:
                raise InvalidBatchError(
                    f"table {table!r}, column {column!r}: unknown cursor position {seq} of shard {self.shard}; "
                    f"expected 0..{feed.seq} (a cursor this bank gave out)"
                )
        rows, upto, complete = feed.rows_since(seq, t.n, limit)
        return t.keys[rows].copy(), (self.feed_epoch, upto), complete

    def feed_stats(self) -> dict[str, dict[str, int]]:
        """Per ``table/column`` feed: rows compared, rows that moved, and the newest sequence number."""
        return {f"{table}/{column}": {"compared": f.compared, "moves": f.moves, "seq": f.seq}
                for table, feeds in self.feeds.items() for column, f in feeds.items()}

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
        """Write column values (upsert; the last occurrence of a key in the batch wins); returns the unique keys
        written. See :meth:`update_wrote`."""
        return self.update_wrote(table, keys, values, model_step=model_step, maker=maker)[0]

    def update_wrote(
        self,
        table: str,
        keys: Any,
        values: Mapping[str, Any],
        *,
        model_step: int = 0,
        maker: str = "",
        checked: bool = False,
    ) -> tuple[np.ndarray, Written | None]:
        """Write column values (upsert; the last occurrence of a key in the batch wins).

        Missing keys are allocated first (other columns get their initial values). Each written row's
        ``version`` goes up by one and its provenance is set to ``(model_step, maker, now)``.

        ``checked`` says the values were checked and cast by :func:`~carls_dask.bank.schema.check_update`
        already (the bank client does, before it sends a batch): they are not checked again.

        Returns
        -------
        tuple
            The unique keys written, and the rows written (None when rows moved since: an eviction).
        """
        t = self.table(table)
        k, b, h = self._keys(t, keys)
        stages.mark("shard", "key check and hashing")
        n = k.shape[0]
        given = dict(values) if checked else check_update(t.spec, n, values, model_step, maker)
        stages.mark("shard", "validation")
        code = self.maker_code(maker)
        now = self.clock()
        bnd = self.bounds.get(t.spec.name)
        if bnd is not None and bnd.ttl_due(now):
            self._expire(t, bnd, now)
        last = dedupe(k, h, keep="last")[0]  # the last occurrence of each key wins
        uniq = k[last]
        stages.mark("shard", "dedupe")
        urows = t.index.find(uniq, t.keys, h[last])
        missing = urows < 0
        stages.mark("shard", "index probe")
        if missing.any():
            urows[missing] = self._allocate(t, uniq[missing], b[last[missing]], now, h[last[missing]])
        stages.mark("shard", "allocation")
        for name, v in given.items():
            t.cols[name].put(urows, v, last)
        if self._ann:
            self._ann_touch(t, uniq)
        stages.mark("shard", "write")
        self._touch(t, urows, now, int(model_step), code)
        written: Written | None = Written(t.spec.name, urows)
        if bnd is not None and self._enforce_cap(t, bnd, urows):  # an update always writes, then the cap holds
            written = None  # the eviction moved rows
        return uniq, written

    def _touch(self, t: TableState, rows: np.ndarray, now: float, model_step: int | None, code: int | None) -> None:
        """Provenance and change marks of distinct written ``rows``, in one pass (then the change feeds)."""
        touch_rows(t.meta, t.maker, self.dirty[t.spec.name].marks_for(t.n), rows, now, model_step, code)
        self._feed(t, rows)
        self.version += 1
        stages.mark("shard", "provenance")

    def apply_gradients(
        self,
        table: str,
        keys: Any,
        grads: Mapping[str, Any] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
        model_step: int | None = None,
        maker: str | None = None,
    ) -> np.ndarray:
        """Apply the table's optimizer to the rows of ``keys``; returns which keys were present (see
        :meth:`apply_gradients_wrote`)."""
        return self.apply_gradients_wrote(table, keys, grads, column=column, learning_rate=learning_rate,
                                          model_step=model_step, maker=maker)[0]

    def apply_gradients_wrote(
        self,
        table: str,
        keys: Any,
        grads: Mapping[str, Any] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
        model_step: int | None = None,
        maker: str | None = None,
        checked: bool = False,
    ) -> tuple[np.ndarray, Written | None]:
        """Apply the table's optimizer to the rows of ``keys`` (duplicate keys' gradients are summed).

        Keys that are not in the table are skipped, as in CARLS; the returned mask says which were applied.
        ``model_step`` and ``maker`` (the trainer's step and name) become the updated rows' provenance;
        None keeps what the rows had.
        Gradients are cast to the column's compute dtype (see :func:`~carls_dask.bank.optimizers.compute_dtype`)
        and the update runs in it. Each updated row's slots, Adam's per-row ``step`` among them, move one
        step, whatever other rows did: the row alone decides its next update.

        ``checked`` says the gradients were checked and cast by :func:`~carls_dask.bank.schema.check_gradients`
        already (the bank client does, before it sends a batch): they are not checked again.

        Returns
        -------
        tuple
            ``bool[n]``: whether each key's row was present and updated; and the rows written (None when none).
        """
        t = self.table(table)
        spec = t.spec
        k, _, h = self._keys(t, keys)
        stages.mark("shard", "key check and hashing")
        n = k.shape[0]
        if checked:  # checked and cast by the bank client (check_gradients) before it sent the batch
            given = dict(grads) if isinstance(grads, Mapping) else {column: grads}
            lr = check_learning_rate(spec.name, spec.learning_rate if learning_rate is None else learning_rate)
        else:
            given, lr = check_gradients(spec, n, grads, column, learning_rate)
        stages.mark("shard", "validation")
        rows = t.index.find(k, t.keys, h)
        found = rows >= 0
        stages.mark("shard", "index probe")
        if not found.any():
            return found, None
        all_found = bool(found.all())
        frows = rows if all_found else rows[found]
        now = self.clock()
        results: list[tuple[str, np.ndarray, dict[str, np.ndarray]]] = []
        plans = []
        urows = frows
        for name, g in given.items():
            gf = g if all_found else g[found]
            # the step computed where the rows live, each row's duplicate gradients added in batch order as it
            # is read (see carls_dask.bank.rowstep); otherwise on gathered copies, the sums made first
            grouped = group_by_row(frows) if name in t.slots else None
            plan = None if grouped is None else plan_step(
                str(spec.optimizer), t.cols[name], t.slots[name], grouped[0], gf, learning_rate=float(lr),
                betas=spec.adam_betas, epsilon=spec.adam_epsilon, empty=self.buffers.empty, first=grouped[1],
                nxt=grouped[2])
            stages.mark("shard", "dedupe")
            if plan is not None and grouped is not None:
                urows = grouped[0]
                plans.append((name, plan))
                continue
            urows, summed = sum_by_row(frows, gf)
            if name in t.slots:
                cur = {s: a[urows] for s, a in t.slots[name].items()}
            else:
                col = spec.column(name)
                cur = initial_slots(spec.optimizer, urows.shape[0], col.shape, col.np_dtype,
                                    spec.adagrad_initial_accumulator)
            new_w, new_slots = apply_optimizer(str(spec.optimizer), t.cols[name][urows], summed, cur,
                                               learning_rate=float(lr), betas=spec.adam_betas,
                                               epsilon=spec.adam_epsilon)
            if not np.isfinite(new_w).all():
                raise self._non_finite(t, name)
            results.append((name, new_w, new_slots))
        done: list[StepPlan] = []
        for name, plan in plans:  # every reference column checked: now the in-place steps, taken back on failure
            if not plan.run():
                for other in reversed(done):
                    other.undo()
                raise self._non_finite(t, name)
            done.append(plan)
        stages.mark("shard", "optimizer arithmetic")
        for name, new_w, new_slots in results:
            slots = t.ensure_slots(name)
            t.cols[name][urows] = new_w
            for s, a in new_slots.items():
                slots[s][urows] = a
        if self._ann:
            self._ann_touch(t, t.keys[urows])
        stages.mark("shard", "write")
        self._touch(t, urows, now, None if model_step is None else int(model_step),
                    None if maker is None else self.maker_code(maker))
        return found, Written(t.spec.name, urows)

    @staticmethod
    def _non_finite(t: TableState, name: str) -> InvalidBatchError:
        return InvalidBatchError(f"table {t.spec.name!r}, column {name!r}: the {t.spec.optimizer} step would make "
                                 "weights non-finite; nothing was changed")

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
        if (order := self._rank_orders.get(table)) is not None:
            order.on_delete(t.keys, t.n, dead, movers, holes)
        if self._ann:
            self._ann_touch(t, t.keys[dead])
        if movers.size:
            slots, _ = t.index.find_slots(t.keys[movers], t.keys)
            for _name, arr in list(t.storage()):
                arr[holes] = arr[movers]
            t.index.set_rows(slots, holes)
        self.dirty[t.spec.name].moved(holes, movers, n_new)
        for feed in self.feeds.get(t.spec.name, {}).values():
            feed.moved(holes, movers, n_new)
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
        exclude_true: bool = False,
    ) -> NegativeSample:
        """Sample ``n`` candidates from this shard's keys at ``O(n)`` per call, with expected counts.

        ``uniform`` draws rows directly; ``log_uniform`` draws frequency ranks from a rank order rebuilt
        lazily (see :mod:`carls_dask.bank.shard_sampler`, which says which distribution is sampled and
        when the order is rebuilt). Expected counts are ``n * p`` (with replacement) or TensorFlow's
        ``1 - (1 - p) ** num_tries`` (unique) for the one-draw probability ``p`` of that distribution.
        With ``exclude_true`` the true keys are never returned (the distribution is conditioned on
        not drawing one, and their own expected counts are 0).
        """
        n = check_sample_size(table, n)
        d = self.sample_draw(table, n, sampler=sampler, unique=unique, true_keys=true_keys, seed=seed,
                             exclude_true=exclude_true)
        return NegativeSample(
            keys=d.keys,
            expected_count=expected_counts(n, unique, d.num_tries, d.prob),
            true_expected_count=expected_counts(n, unique, d.num_tries, d.true_prob),
            num_tries=d.num_tries,
        )

    def sample_draw(
        self,
        table: str,
        n: int,
        sampler: str = "uniform",
        unique: bool = True,
        true_keys: Any = None,
        seed: int | None = None,
        exclude_true: bool = False,
    ) -> ShardDraw:
        """:meth:`sample_negatives` as one-draw probabilities (what the client merges across shards)."""
        t = self.table(table)
        n = check_sample_size(table, n)
        if n <= 0:
            raise InvalidBatchError(f"table {table!r}: sample size must be positive, got n={n}")
        true_rows = None
        if true_keys is not None:
            tk = check_keys(table, true_keys, allow_empty=True)
            true_rows = t.index.find(tk, t.keys) if tk.size else np.zeros(0, dtype=np.int64)
        order = self._rank_orders.get(table)
        if order is None:
            order = self._rank_orders[table] = RankOrder(self.sampling)
        return draw_from_shard(table, t.keys, t.frequency, t.n, order, int(n), sampler=sampler, unique=unique,
                               true_rows=true_rows, rng=np.random.default_rng(seed), exclude_true=exclude_true)

    def sampling_state(self, table: str) -> dict[str, Any]:
        """Counters of ``table``'s frequency-rank order (``built``, ``rebuilds``, ``ranks``, ``tombstones``, ...)."""
        self.table(table)
        return describe(self._rank_orders.get(table))

    def top_k(
        self, table: str, query: Any, k: int, column: str = "embedding", metric: str = "dot",
        method: str = "exact",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows of this shard by dot product or cosine similarity, exact or approximate.

        Returns ``(keys[q, k'], scores[q, k'])`` best first (ties: smaller key first), where
        ``k' = min(k, usable rows)`` (rows with a zero norm are not usable under cosine). With
        ``method="exact"`` large tables and query batches use FAISS's exact flat index when ``faiss`` is
        installed, NumPy otherwise (see :func:`carls_dask.bank.topk.exact_top_k`). With ``method="ivf"``
        a FAISS IVF index of the column, kept current as rows change, is searched (see
        :mod:`carls_dask.bank.ann`): the scores are exact, the rows found approximate.
        """
        t = self.table(table)
        if method not in METHODS:
            raise InvalidBatchError(f"table {table!r}: top_k method {method!r} is unknown; expected one of {METHODS}")
        q = check_top_k_query(t.spec, query, k, column, metric)
        if method == "exact" or t.n == 0:
            return exact_top_k(t.cols[column][: t.n], t.keys[: t.n], q, int(k), metric, backend="auto")
        return self._ann_top_k(t, q, int(k), column, metric)

    def _ann_top_k(self, t: TableState, q: np.ndarray, k: int, column: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`top_k` through the table's IVF index (created on first use, refreshed before searching)."""
        ix = self._ann.get((t.spec.name, column, metric))
        if ix is None:
            ix = self._ann[(t.spec.name, column, metric)] = AnnIndex(t.spec.column(column).shape[0], metric, self.ann)
        col = t.cols[column]
        ix.refresh(lambda i, j: col[i:j], lambda rows: col[rows], lambda ks: t.index.find(ks, t.keys), t.keys, t.n)
        qq = np.asarray(q, dtype=np.float32)
        if metric == "cosine":
            qq = qq / np.maximum(np.linalg.norm(qq, axis=1, keepdims=True), 1e-12)
        out_k, out_s, short = ix.search(qq, k)
        if short.any():  # fewer rows in the probed cells than k: answer those query rows exactly
            rows = np.flatnonzero(short)
            ek, es = exact_top_k(col[: t.n], t.keys[: t.n], q[rows], k, metric, backend="auto")
            out_k[rows], out_s[rows] = ek[:, : out_k.shape[1]], es[:, : out_k.shape[1]]
        return out_k, out_s

    def _ann_touch(self, t: TableState, keys: np.ndarray) -> None:
        """Tell ``t``'s IVF indexes that the rows of ``keys`` were written, added or deleted."""
        for (name, _, _), ix in self._ann.items():
            if name == t.spec.name:
                ix.touch(keys, t.n)

    def ann_state(self, table: str) -> dict[str, Any]:
        """Builds, updates and size of ``table``'s IVF indexes, by ``column/metric``."""
        self.table(table)
        return {f"{c}/{m}": {"built": ix.index is not None, "builds": ix.builds, "updates": ix.updates,
                             "vectors": 0 if ix.index is None else int(ix.index.ntotal), "bytes": ix.nbytes}
                for (name, c, m), ix in self._ann.items() if name == table}

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
            if name in self.bounds:
                out["tables"][name]["bounds"] = self.bounds[name].stats()
        if self.feeds:
            out["feeds"] = self.feed_stats()
        return out

    def export_state(self) -> dict[str, Any]:
        """The shard's whole state as JSON-able meta plus row-aligned numpy arrays (copies)."""
        meta = self.export_state_meta()
        tables = {name: {a: _copy_rows(arr, t.n) for a, arr in t.arrays()} for name, t in self.tables.items()}
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
        """Move the change marks to pending: a snapshot of the current state starts (see :mod:`~carls_dask.bank.dirty`).

        The frequency-rank orders of log-uniform sampling are dropped too, so the next draw orders the
        rows as of now. A bank restored from this snapshot has no order either and builds it from the
        same rows on its first draw: a run resumed from a snapshot samples what the uninterrupted run
        samples (the order is not part of the stored state, but its history then starts at the snapshot).
        """
        for d in self.dirty.values():
            d.freeze()
        self._rank_orders.clear()

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

    def reserve(self, table: str, rows: int) -> None:
        """Make room for ``rows`` rows of ``table`` in all (storage and key index) before a bulk load, so that
        loading them never grows (and copies) an array while it already holds most of them."""
        t = self.table(table)
        t.reserve(int(rows))
        t.index.reserve(int(rows), t.keys)

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
                if (order := self._rank_orders.get(table)) is not None:
                    order.note_changes(n)
            elif name == "prov/maker":
                names = list(makers) if makers is not None else self.makers
                lut = np.array([self.maker_code(m) for m in names], dtype=np.int32)
                t.prov["maker"][at] = lut[v]
            elif name.startswith("prov/"):
                t.prov[name[5:]][at] = v
            elif name.startswith("col/"):
                t.cols[name[4:]][at] = v
                if self._ann:
                    self._ann_touch(t, keys)
            elif name.startswith("slot/"):
                _, cname, sname = name.split("/")
                t.ensure_slots(cname)[sname][at] = v
        self._mark(t, at if isinstance(at, slice) else rows)
        return int(n)
