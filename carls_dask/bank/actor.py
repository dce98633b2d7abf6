"""The Dask actor shell around one :class:`~carls_dask.bank.core.ShardCore`.

The actor adds only what needs a process: it holds the core, appends the mutating batches of its logged
tables to the shard's delta log before the call returns (each table's durability policy says whether the
append is synced at once, ``every-write``, or with its group, ``group``; ``snapshot`` tables are not
logged), writes its own state into a snapshot, and loads its rows back from a snapshot plus the delta log on
restore. All semantics live in the core.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from carls_dask.bank import stages
from carls_dask.bank.ann import AnnSettings
from carls_dask.bank.calls import Failed
from carls_dask.bank.core import LookupRows, ShardCore, Written
from carls_dask.bank.operations import OPERATIONS, bind, operation
from carls_dask.bank.sampling import NegativeSample
from carls_dask.bank.schema import TableSpec
from carls_dask.bank.shard_sampler import SamplingSettings, ShardDraw
from carls_dask.errors import InvalidArgumentError, RolledBackError, ShardLostError
from carls_dask.storage.bankstore import MAKERS_TABLE, BankReplay, encode_makers, restore_point
from carls_dask.storage.fsutil import check_reserve

__all__ = ["BATCHABLE", "MAKERS_TABLE", "OP_ID", "BankShard"]

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(method: _F) -> _F:
    """Run the method under the shard's lock (actor calls and co-located direct calls may overlap).

    The ``fdatasync`` an ``every-write`` append owes is made after the lock is released and before the call
    returns (group commit): the next call proceeds meanwhile, and one sync serves every caller waiting.
    """

    @functools.wraps(method)
    def wrapper(self: BankShard, *args: Any, **kwargs: Any) -> Any:
        stages.begin()
        local = self._local
        with self._lock:
            local.depth = getattr(local, "depth", 0) + 1
            try:
                if method.__name__ not in _AFTER_RETIRE:
                    self._check_live()
                stages.mark("shard", "lock")
                out = method(self, *args, **kwargs)
            finally:
                local.depth -= 1
                due = self._take_sync() if local.depth == 0 else None
        if due is not None:
            due.flush()
            stages.mark("shard", "delta log sync")
        return out

    return wrapper  # type: ignore[return-value]


#: Methods a retired shard still answers (everything else raises ShardLostError, which re-routes the call).
_AFTER_RETIRE = frozenset(op.name for op in OPERATIONS.values() if op.after_retire)

#: Methods that may run inside :meth:`BankShard.batch` (the batched operations of a training step and
#: the other per-key reads and writes).
BATCHABLE = frozenset(op.name for op in OPERATIONS.values() if op.batchable)


class _Logged:
    """A batch recovered from the delta log on restore: the keys its record(s) carried."""

    __slots__ = ("keys",)

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = np.asarray(keys, dtype=np.int64)


class _Mask:
    """A remembered boolean answer (which keys were found or deleted), packed to one bit per key."""

    __slots__ = ("bits", "n")

    def __init__(self, mask: np.ndarray) -> None:
        self.bits = np.packbits(mask)
        self.n = int(mask.shape[0])

    def unpack(self) -> np.ndarray:
        return np.unpackbits(self.bits, count=self.n).astype(bool)


#: Name of the delta-log array that carries the client's operation id of a mutating batch (one value
#: repeated on every row), so that a batch retried after its shard was re-homed is applied once.
OP_ID = "op_id"
#: Bytes of snapshot rows a restoring shard reads at a time (it holds one such block beside its rows).
_RESTORE_BLOCK_BYTES = 64 << 20
#: Operation ids (and their answers) a shard remembers for recognising a retried batch.
_OPS_REMEMBERED = 4096
#: Bytes of a delta-log frame besides its rows (frame head and JSON header), for the disk-reserve check.
_FRAME_OVERHEAD = 4096


@bind
class BankShard:
    """One knowledge-bank shard, run as a Dask actor (``client.submit(BankShard, ..., actor=True)``).

    Parameters
    ----------
    tables
        Resolved table specs as JSON (:meth:`TableSpec.to_json`).
    shard, n_shards, buckets, owned_buckets, initial_capacity
        See :class:`~carls_dask.bank.core.ShardCore`.
    log_root
        Bank store folder; when given, every mutating batch of a logged table (durability ``every-write`` or
        ``group``) is appended to this shard's :class:`carls_dask.storage.deltalog.DeltaLog` before the call
        returns, and a re-homed shard is rebuilt from it.
    log_sync
        ``fdatasync`` the log at all (durability); off only for throw-away banks.
    settings
        Resolved on the driver (:func:`carls_dask.bank.client.shard_settings`; a shard reads no configuration):
        ``group_interval`` (seconds) and ``group_bytes`` of the ``group`` tables' syncs (``carls.bank.log.*``),
        ``reserve``: free bytes the store's disk keeps (``carls.storage.disk-reserve``; a logged write that
        would take it below is refused before anything changes), ``answer_buffers``, ``sampling`` and ``ann``
        (``carls.bank.answer-buffers``, ``carls.bank.sampling.*``, ``carls.bank.ann.*``); a setting left out
        takes the built-in default of the class it configures.
    """

    def __init__(
        self,
        tables: Sequence[Mapping[str, Any]],
        shard: int,
        n_shards: int,
        buckets: int,
        owned_buckets: Sequence[int] | None = None,
        initial_capacity: int = 1024,
        log_root: str | None = None,
        log_sync: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        specs = [TableSpec.from_json(t) for t in tables]
        given = dict(settings or {})
        self.core = ShardCore(
            specs,
            shard=shard,
            n_shards=n_shards,
            buckets=buckets,
            owned_buckets=owned_buckets,
            initial_capacity=initial_capacity,
            answer_buffers=int(given.get("answer_buffers", 64 << 20)),
            sampling=SamplingSettings(**given.get("sampling", {})),
            ann=AnnSettings(**given.get("ann", {})),
        )
        self._lock = threading.RLock()
        self._local = threading.local()  # per calling thread: lock depth, and whether a sync is owed
        self.log_root = log_root
        self.step = 0
        self._log: Any = None
        self._logged_makers = 1  # code 0 ("") needs no record
        # answers of recent mutating batches by operation id (a retry after a re-home gets the same answer)
        self._ops: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._retired: str | None = None
        # incremental snapshots: the committed (store, version) this shard's change marks are relative to,
        # and the snapshot written whose commit is not yet known
        self._synced: tuple[str, int] | None = None
        self._pending: tuple[str, int] | None = None
        settings = given
        #: Each table's durability policy (a spec without one is ``every-write``).
        self.policies: dict[str, str] = {t.name: t.durability or "every-write" for t in specs}
        self._sync = bool(log_sync)
        self._reserve = int(settings.get("reserve", 0))
        # tables kept by snapshots that were rolled back to one when this shard was rebuilt: (version, step)
        self._fenced: dict[str, tuple[int, int]] = {}
        if log_root is not None and any(p != "snapshot" for p in self.policies.values()):
            from carls_dask.storage.deltalog import DeltaLog

            group = log_sync and "group" in self.policies.values()
            self._log = DeltaLog(log_root, shard, sync=log_sync,
                                 group_interval=float(settings.get("group_interval", 0.01)) if group else None,
                                 group_bytes=int(settings.get("group_bytes", 8 << 20)), reserve=self._reserve)
            self.core.record_evictions(True)  # evictions of bounded tables are logged as deletes

    # -- delta log ----------------------------------------------------------------------------------
    def _logged(self, table: str) -> bool:
        """Whether writes of ``table`` go to the delta log (a log is open and its policy is not ``snapshot``)."""
        return self._log is not None and self.policies.get(table, "every-write") != "snapshot"

    def _synced_now(self, table: str) -> bool:
        """Whether an append of ``table`` is synced before the call returns (``every-write``)."""
        return self._sync and self.policies.get(table, "every-write") == "every-write"

    def _append(self, table: str, op: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Append a frame of ``table``; an ``every-write`` one owes a sync before the call returns, which the
        call makes once it has released the shard's lock (see :func:`_locked`)."""
        assert self._log is not None
        self._log.append(self.step, table, op, arrays, sync=False)
        if self._synced_now(table):
            self._local.due = True

    def _take_sync(self) -> Any:
        """The log whose sync the finished call owes (None when it owes none); called under the lock."""
        due, self._local.due = getattr(self._local, "due", False), False
        return self._log if due and self._log is not None else None

    def _check_room(self, table: str, n: int, rows: bool = True) -> None:
        """Refuse (before the core changes anything) a logged write of ``n`` keys that would take the store's
        disk below the reserve: a frame of full rows (or of deleted keys) is estimated from the table's arrays."""
        if self._reserve <= 0 or not self._logged(table) or self.log_root is None:
            return
        t = self.core.table(table)
        per_row = 20
        if rows:
            per_row = 8 + sum(int(a.dtype.itemsize) * int(np.prod(a.shape[1:], dtype=np.int64)) for _, a in t.arrays())
        check_reserve(self.log_root, _FRAME_OVERHEAD + int(n) * per_row, self._reserve,
                      f"bank shard {self.core.shard}, table {table!r}")

    def _check_fence(self, table: str) -> None:
        """Refuse a write of a table rolled back to a snapshot until its writers roll back too (:meth:`rollback`)."""
        cut = self._fenced.get(table)
        if cut is None:
            return
        where = f"snapshot v{cut[0]} (step {cut[1]})" if cut[0] >= 0 else "its state before any snapshot (empty)"
        raise RolledBackError(
            f"bank shard {self.core.shard}: table {table!r} was rolled back to {where} when its shard was lost "
            f"(durability 'snapshot'); it takes no writes until its writers roll back to step {cut[1]} too "
            "(KnowledgeBank.rollback; a run does both itself)")

    def _log_makers(self) -> None:
        makers = self.core.makers
        if self._log is None or len(makers) <= self._logged_makers:
            return
        codes = list(range(self._logged_makers, len(makers)))
        # synced with the frame that needs it (the same file, written before it)
        self._log.append(self.step, MAKERS_TABLE, "upsert", encode_makers(codes, [makers[c] for c in codes]),
                         sync=False)
        self._logged_makers = len(makers)

    def _log_upsert(self, table: str, keys: np.ndarray, written: Written | None, op_id: int | None = None) -> None:
        """Log the full rows the batch just wrote: the rows the core's call returned (no second look-up of the
        batch's keys), or those of ``keys`` when rows moved since (an eviction)."""
        if not self._logged(table):
            return
        self._log_makers()
        if written is not None and written.table == table:
            rows = self.core.row_arrays(table, written.rows)
        else:
            rows = self.core.rows(table, np.unique(keys))
        if rows["keys"].size:
            if op_id is not None:
                rows = {**rows, OP_ID: np.full(rows["keys"].shape[0], op_id, dtype=np.int64)}
            self._append(table, "upsert", rows)

    def _log_delete(self, table: str, keys: np.ndarray, op_id: int | None = None) -> None:
        if not self._logged(table) or keys.size == 0:
            return
        k = np.unique(keys)
        from carls_dask.bank.hashing import bucket_of

        arrays = {"keys": k, "bucket": bucket_of(k, self.core.buckets)}
        if op_id is not None:
            arrays[OP_ID] = np.full(k.shape[0], op_id, dtype=np.int64)
        self._append(table, "delete", arrays)

    def _log_evictions(self, table: str) -> None:
        """Log the rows a bounded table evicted (cap, TTL) as deletes, before the batch's own upserts.

        A TTL sweep may delete a key the same batch then allocates again; deletes first keeps the
        replay exact. Replay applies rows and deletes only, never admission or eviction.
        """
        evicted = self.core.take_evicted(table)
        if evicted.size:
            self._log_delete(table, evicted)

    # -- retried batches ----------------------------------------------------------------------------
    def _check_live(self) -> None:
        if self._retired is not None:
            raise ShardLostError(f"bank shard {self.core.shard}: {self._retired}; the bank client re-routes the call")

    def _remember(self, op_id: int | None, answer: Any) -> None:
        if op_id is None:
            return
        if isinstance(answer, np.ndarray) and answer.dtype == bool:  # one bit per key: thousands are kept
            answer = _Mask(answer)
        self._ops[int(op_id)] = answer
        while len(self._ops) > _OPS_REMEMBERED:
            self._ops.popitem(last=False)

    def _seen(self, op_id: int | None, keys: np.ndarray, kind: str) -> Any:
        """The answer of an already applied batch ``op_id`` (None when it was not applied here).

        A batch recovered from the delta log has no stored answer; it is rebuilt from the logged keys:
        ``update`` wrote them all, ``apply_gradients`` found (and ``delete`` removed) exactly those.
        """
        if op_id is None or int(op_id) not in self._ops:
            return None
        answer = self._ops[int(op_id)]
        if isinstance(answer, _Mask):
            return answer.unpack()
        if not isinstance(answer, _Logged):
            return answer
        if kind == "update":
            return int(answer.keys.size)
        return np.isin(np.asarray(keys, dtype=np.int64), answer.keys)

    @_locked
    def set_step(self, step: int) -> int:
        """Set the step recorded with delta-log records (and snapshots); returns it."""
        self.step = int(step)
        return self.step

    # -- operations ---------------------------------------------------------------------------------
    @_locked
    def lookup(
        self,
        table: str,
        keys: np.ndarray,
        columns: Sequence[str] | None = None,
        insert: bool = False,
        counts: np.ndarray | None = None,
        op_id: int | None = None,
    ) -> LookupRows:
        """See :meth:`ShardCore.lookup_rows`; a retried ``insert`` batch (same ``op_id``) only reads."""
        if insert and self._seen(op_id, keys, "lookup") is not None:
            insert = False
        if insert:
            self._check_fence(table)
            self._check_room(table, len(keys))
        res, written = self.core.lookup_rows_wrote(table, keys, columns=columns, insert=insert, counts=counts)
        if insert:
            if self._logged(table):  # allocations and frequencies are state: log the rows
                self._log_evictions(table)
                self._log_upsert(table, np.asarray(keys, dtype=np.int64), written, op_id)
                stages.mark("shard", "delta log")
            self._remember(op_id, True)
        return res

    @_locked
    def batch(self, ops: Sequence[tuple[str, tuple[Any, ...], Mapping[str, Any]]]) -> list[Any]:
        """Run several calls in order under one hold of the lock: one message for a step's reads and pushes.

        Each ``(method, args, kwargs)`` is one of :data:`BATCHABLE` and answers on its own, as if sent
        alone: its answer, or :class:`~carls_dask.bank.calls.Failed` carrying its error (the calls after
        it still run). A retired shard raises for the whole batch, which the client re-routes.
        """
        for method, _, _ in ops:
            if not operation(method).batchable:
                raise InvalidArgumentError(f"bank shard {self.core.shard}: {method!r} cannot run in a batch; "
                                           f"expected one of {sorted(BATCHABLE)}")
        out: list[Any] = []
        for method, args, kwargs in ops:
            try:
                out.append(getattr(self, method)(*args, **kwargs))
            except ShardLostError:
                raise
            except Exception as exc:
                out.append(Failed(exc))
        return out

    async def call_on_loop(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` run on the worker's event loop when the shard is free, else in a thread.

        Dask runs an actor's coroutine methods on the worker's event loop, which saves the hop to the
        actor's thread and back that a plain method call costs (a large share of a small batch's time).
        The client sends a batch this way when each shard's part of it is small enough to hold the loop
        for milliseconds only; when another call holds the shard (a snapshot, say), the call waits in a
        thread instead, so the event loop is never blocked on the shard's lock.
        """
        if self._lock.acquire(blocking=False):
            local = self._local
            local.depth = getattr(local, "depth", 0) + 1
            try:
                out = getattr(self, method)(*args, **kwargs)
            finally:
                local.depth -= 1
                due = self._take_sync() if local.depth == 0 else None
                self._lock.release()
            if due is not None:  # the sync it owes, off the event loop and outside the lock
                await asyncio.get_running_loop().run_in_executor(None, due.flush)
            return out
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(getattr(self, method), *args, **kwargs))

    @_locked
    def update(
        self, table: str, keys: np.ndarray, values: Mapping[str, np.ndarray], model_step: int = 0, maker: str = "",
        op_id: int | None = None,
    ) -> int:
        """See :meth:`ShardCore.update`; returns the number of distinct keys written. The values come checked and
        cast by the bank client (:func:`~carls_dask.bank.schema.check_update`), which refuses a bad batch before
        any shard is called; the shard checks its keys (the buckets it owns) and does not check the values again."""
        if (seen := self._seen(op_id, keys, "update")) is not None:
            return int(seen)
        self._check_fence(table)
        self._check_room(table, len(keys))
        uniq, written = self.core.update_wrote(table, keys, values, model_step=model_step, maker=maker, checked=True)
        self._log_evictions(table)
        self._log_upsert(table, uniq, written, op_id)
        stages.mark("shard", "delta log")
        self._remember(op_id, int(uniq.size))
        return int(uniq.size)

    @_locked
    def apply_gradients(
        self,
        table: str,
        keys: np.ndarray,
        grads: Mapping[str, np.ndarray] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
        model_step: int | None = None,
        maker: str | None = None,
        op_id: int | None = None,
    ) -> np.ndarray:
        """See :meth:`ShardCore.apply_gradients`; a retried batch (same ``op_id``) is not applied twice. The
        gradients come checked and cast by the bank client (:func:`~carls_dask.bank.schema.check_gradients`); the
        shard checks its keys and the step's result (a non-finite weight), not the gradients again."""
        if (seen := self._seen(op_id, keys, "apply_gradients")) is not None:
            return np.asarray(seen, dtype=bool)
        self._check_fence(table)
        self._check_room(table, len(keys))
        found, written = self.core.apply_gradients_wrote(table, keys, grads, column=column,
                                                         learning_rate=learning_rate, model_step=model_step,
                                                         maker=maker, checked=True)
        if self._logged(table) and found.any():
            self._log_upsert(table, np.asarray(keys, dtype=np.int64)[found], written, op_id)
        stages.mark("shard", "delta log")
        self._remember(op_id, found)
        return found

    @_locked
    def delete(self, table: str, keys: np.ndarray, op_id: int | None = None) -> np.ndarray:
        """See :meth:`ShardCore.delete`; a retried batch (same ``op_id``) answers as the first time."""
        if (seen := self._seen(op_id, keys, "delete")) is not None:
            return np.asarray(seen, dtype=bool)
        self._check_fence(table)
        self._check_room(table, len(keys), rows=False)
        present = self.core.delete(table, keys)
        self._log_delete(table, np.asarray(keys, dtype=np.int64)[present], op_id)
        self._remember(op_id, present)
        return present

    @_locked
    def expire(self, table: str) -> int:
        """See :meth:`ShardCore.expire`; the expired rows are logged as deletes."""
        self._check_fence(table)
        n = self.core.expire(table)
        self._log_evictions(table)
        return n

    @_locked
    def contains(self, table: str, keys: np.ndarray) -> np.ndarray:
        """See :meth:`ShardCore.contains`."""
        return self.core.contains(table, keys)

    @_locked
    def size(self, table: str | None = None) -> int:
        """See :meth:`ShardCore.size`."""
        return self.core.size(table)

    @_locked
    def keys(self, table: str) -> np.ndarray:
        """See :meth:`ShardCore.keys`."""
        return self.core.keys(table)

    @_locked
    def changes(
        self, table: str, column: str, since: tuple[str, int] | None = None, limit: int | None = None
    ) -> tuple[np.ndarray, tuple[str, int], bool]:
        """See :meth:`ShardCore.changes`."""
        return self.core.changes(table, column, since, limit)

    @_locked
    def keys_and_frequency(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`ShardCore.keys_and_frequency`."""
        return self.core.keys_and_frequency(table)

    @_locked
    def sample_negatives(self, table: str, n: int, **kwargs: Any) -> NegativeSample:
        """See :meth:`ShardCore.sample_negatives` (this shard's keys only)."""
        return self.core.sample_negatives(table, n, **kwargs)

    @_locked
    def sample_draw(self, table: str, n: int, *args: Any, **kwargs: Any) -> ShardDraw:
        """See :meth:`ShardCore.sample_draw` (this shard's share of a bank-wide sample)."""
        return self.core.sample_draw(table, n, *args, **kwargs)

    @_locked
    def sampling_state(self, table: str) -> dict[str, Any]:
        """See :meth:`ShardCore.sampling_state`."""
        return self.core.sampling_state(table)

    @_locked
    def top_k(
        self, table: str, query: np.ndarray, k: int, column: str = "embedding", metric: str = "dot",
        method: str = "exact",
    ) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`ShardCore.top_k`."""
        return self.core.top_k(table, query, k, column=column, metric=metric, method=method)

    @_locked
    def ann_state(self, table: str) -> dict[str, Any]:
        """See :meth:`ShardCore.ann_state`."""
        return self.core.ann_state(table)

    @_locked
    def stats(self) -> dict[str, Any]:
        """See :meth:`ShardCore.stats`, plus the worker-side wall time and the CPU seconds its process has used."""
        out = self.core.stats()
        out["wall_time"] = time.time()
        out["process_cpu_s"] = time.process_time()
        out["logging"] = self._log is not None
        out["durability"] = dict(self.policies)
        out["log"] = self._log.stats() if self._log is not None else None
        out["rolled_back"] = {t: {"version": v, "step": st} for t, (v, st) in self._fenced.items()}
        return out

    @_locked
    def sync(self) -> int:
        """Make every frame this shard logged durable now (``group`` tables' frames included); one
        ``fdatasync`` serves every caller waiting. Returns the log's durable sequence number (0 without a log)."""
        return self._log.flush() if self._log is not None else 0

    def ping(self) -> int:
        """Cheap liveness check; returns the shard id."""
        return self.core.shard

    @_locked
    def export_state(self) -> dict[str, Any]:
        """See :meth:`ShardCore.export_state`."""
        return self.core.export_state()

    # -- persistence --------------------------------------------------------------------------------
    @_locked
    def snapshot(self, handle: Any, full: bool = False, max_changed: float = 0.5) -> dict[str, Any]:
        """Write this shard's state, or only its changes, into the begun snapshot ``handle`` (whole Zarr chunks).

        An increment (the rows changed and keys deleted since ``handle.parent``) is written when the
        handle names a parent, this shard's change marks are relative to that version (it wrote it, or
        the increments before it, and the commit went through), ``full`` is False and at most
        ``max_changed`` of its rows changed; otherwise the full state.

        Consistency: the shard's lock is held for the whole write, so the snapshot is the state at one
        point (after every batch acknowledged before it, before every later one). The full state is read
        chunk by chunk straight from the rows (:meth:`ShardCore.state_view`), never copied whole; only an
        increment's changed rows are copied. The change marks move to a pending generation; they are
        dropped once the snapshot is known to be committed (:meth:`settle_snapshot`) and count again if it
        is not, so a failed snapshot loses no change.
        """
        from carls_dask.storage.snapshots import write_shard

        self._settle()
        for table in self._fenced:
            self._check_fence(table)  # a rolled-back table is not a state to keep
        if self._log is not None:
            self._log_makers()
        seq = int(self._log.seq) if self._log is not None else 0
        incremental = self._incremental(str(handle.root), handle.parent, full, max_changed)
        self.core.freeze_changes()
        try:
            if incremental:
                changes = self.core.export_changes()
                info = write_shard(handle, changes, delta_seq=seq, deleted=changes["deleted"],
                                   live_rows={name: t.n for name, t in self.core.tables.items()})
            else:
                info = write_shard(handle, self.core.state_view(), delta_seq=seq)
        except BaseException:
            self.core.rollback_changes()
            raise
        self._pending = (str(handle.root), int(handle.version))
        if self._log is not None:
            self._log.roll(reopen=True)  # the frames the snapshot covers are all in older segments now
        return info

    def _incremental(self, root: str, parent: int | None, full: bool, max_changed: float) -> bool:
        """Whether this shard's next snapshot into ``root`` on ``parent`` is an increment (see :meth:`snapshot`)."""
        return (not full and parent is not None and self._synced == (str(root), int(parent))
                and self.core.changed_rows() <= float(max_changed) * max(self.core.size(), 1))

    @_locked
    def snapshot_bytes(self, root: str, parent: int | None, full: bool = False, max_changed: float = 0.5) -> int:
        """About the bytes :meth:`snapshot` would write into ``root`` now (its rows, or only the changed ones),
        for the disk-reserve check made before a snapshot begins."""
        self._settle()
        inc = self._incremental(str(root), parent, full, max_changed)
        total = 0
        for name, t in self.core.tables.items():
            rows = self.core.dirty[name].count(t.n) if inc else t.n
            per_row = sum(int(a.dtype.itemsize) * int(np.prod(a.shape[1:], dtype=np.int64)) for _, a in t.arrays())
            total += rows * per_row
        return total

    @_locked
    def settle_snapshot(self) -> bool | None:
        """Resolve the snapshot this shard last wrote: committed (its change marks are dropped) or not (they
        count again). Returns whether it was committed (None when none was pending)."""
        return self._settle()

    def _settle(self) -> bool | None:
        if self._pending is None:
            return None
        from carls_dask.errors import StoreError
        from carls_dask.storage.manifest import list_snapshots

        root, version = self._pending
        try:
            committed = any(int(e["version"]) == version for e in list_snapshots(root))
        except StoreError:
            committed = False
        if committed:
            self.core.commit_changes()
            self._synced = self._pending
        else:
            self.core.rollback_changes()
        self._pending = None
        return committed

    @_locked
    def restore(self, root: str, version: int | None, replay_log: bool = True) -> dict[str, int]:
        """Load the rows of this shard's buckets from snapshot ``version`` and replay the delta log.

        Returns
        -------
        dict
            Rows read from the snapshot and delta records applied.
        """
        batches = BankReplay(root, version, replay_log=replay_log, buckets=self.core.owned_buckets,
                             tables=list(self.core.tables), block_bytes=_RESTORE_BLOCK_BYTES)
        for table, rows in batches.expected_rows().items():
            self.core.reserve(table, self.core.size(table) + rows)
        out = self._apply(batches)
        logger.info("shard %d restored %d rows from v%s and %d delta records", self.core.shard, out["rows"],
                    batches.version, out["records"])
        return out

    def _apply(self, batches: Any) -> dict[str, int]:
        """Apply :class:`~carls_dask.storage.bankstore.BankReplay` batches to this shard's core.

        Operation ids of this shard's own delta records are remembered, so a batch that was logged but
        whose answer was lost with the old process is recognised when the client retries it. Returns the
        rows read from a snapshot and the delta records applied.
        """
        rows = applied = 0
        for batch in batches:
            if batch.from_snapshot and batch.op == "delete":  # an incremental snapshot's deleted keys
                mine = self.core._owned_mask[self._buckets(batch.arrays["keys"])]
                if mine.any():
                    self.core.delete(batch.table, batch.arrays["keys"][mine])
                continue
            if batch.from_snapshot:
                rows += self.core.import_rows(batch.table, batch.arrays, makers=batch.makers)
                continue
            keys = batch.arrays["keys"]
            ops = batch.arrays.get(OP_ID)
            if batch.shard == self.core.shard and ops is not None and ops.size:
                op = int(ops[0])
                prev = self._ops.get(op)
                self._ops[op] = _Logged(keys if not isinstance(prev, _Logged) else np.concatenate([prev.keys, keys]))
            if batch.op == "delete":
                mine = self.core._owned_mask[self._buckets(keys)]
                if mine.any():
                    self.core.delete(batch.table, keys[mine])
                    applied += 1
            elif self.core.import_rows(batch.table, batch.arrays, makers=batch.makers):
                applied += 1
        while len(self._ops) > _OPS_REMEMBERED:
            self._ops.popitem(last=False)
        if self._log is not None:
            # the restored state is the new baseline: record the makers this shard now knows
            self._log_makers()
        return {"rows": rows, "records": applied}

    @_locked
    def rehome_restore(self, root: str, base: tuple[str, int] | None = None) -> dict[str, Any]:
        """Rebuild this (new, empty) shard from the bank store ``root`` after its old worker went away.

        The newest committed snapshot of ``root`` plus the delta log after it; without a snapshot
        there, snapshot ``base`` (``(root, version)`` the bank was restored from, if any) plus the
        whole log of ``root``; without either, the whole log.

        A table kept by snapshots alone (durability ``snapshot``) comes back as that snapshot holds it: what
        was written since died with the old shard. Such a table is fenced (writes raise
        :class:`~carls_dask.errors.RolledBackError`) until :meth:`rollback` lifts it, once its writers are
        rolled back to the snapshot's step too (one consistent cut; a run's Workbench does it).

        Returns
        -------
        dict
            ``rows`` read from a snapshot, delta ``records`` applied, the snapshot ``version`` of ``root``
            used (-1 for none), the ``seconds`` it took and ``rolled_back``: the step each snapshot-kept
            table came back at.
        """
        t0 = time.perf_counter()
        src, version = restore_point(root, base)
        batches = BankReplay(src, version, log_root=root, buckets=self.core.owned_buckets,
                             tables=list(self.core.tables), block_bytes=_RESTORE_BLOCK_BYTES)
        for table, rows in batches.expected_rows().items():
            self.core.reserve(table, self.core.size(table) + rows)
        done = self._apply(batches)
        used = int(version) if src is not None and src == str(root) and version is not None else -1
        step = int(batches.manifest["step"]) if batches.manifest is not None else 0
        for table, policy in self.policies.items():
            if policy == "snapshot":
                self._fenced[table] = (used, step)
        out = {**done, "version": used, "seconds": time.perf_counter() - t0,
               "rolled_back": {t: step for t in self._fenced}}
        logger.info("shard %d re-homed from %s: %s", self.core.shard, root, out)
        return out

    @_locked
    def rollback(self, root: str, version: int | None, tables: Sequence[str]) -> dict[str, int]:
        """Bring ``tables`` back to snapshot ``version`` of ``root`` (None: empty, as before any snapshot).

        Every row they hold now is dropped, then the rows of this shard's buckets are read from the snapshot
        (its chain); nothing of the delta log is applied (tables kept by snapshots have none). The tables'
        fence (see :meth:`rehome_restore`) is lifted, and the next snapshot of this shard is written in full.

        Returns
        -------
        dict
            Rows read per table.
        """
        for table in tables:
            self.core.table(table)  # unknown tables raise before anything changes
        for table in tables:
            keys = self.core.keys(table)
            if keys.size:
                self.core.delete(table, keys)
            self.core.take_evicted(table)
        out = dict.fromkeys(tables, 0)
        if version is not None and int(version) >= 0:
            batches = BankReplay(root, int(version), replay_log=False, buckets=self.core.owned_buckets,
                                 tables=list(tables), block_bytes=_RESTORE_BLOCK_BYTES)
            for table, rows in batches.expected_rows().items():
                self.core.reserve(table, rows)
            for batch in batches:
                if batch.op == "delete":  # an increment's deleted keys
                    mine = self.core._owned_mask[self._buckets(batch.arrays["keys"])]
                    if mine.any():
                        self.core.delete(batch.table, batch.arrays["keys"][mine])
                    continue
                out[batch.table] += self.core.import_rows(batch.table, batch.arrays, makers=batch.makers)
        for table in tables:
            self._fenced.pop(table, None)
        self._synced = None  # the change marks no longer describe the difference to any snapshot
        if self._log is not None:
            self._log_makers()
        logger.info("shard %d: tables %s rolled back to snapshot v%s of %s (%s rows)", self.core.shard,
                    list(tables), version, root, out)
        return out

    @_locked
    def retire(self, reason: str) -> int:
        """Stop serving (its worker is closing): close the delta log; later calls raise ShardLostError.

        Every acknowledged batch is already in the log, so a new shard restored from the store holds
        all of them. Returns the log's last sequence number.
        """
        seq = int(self._log.seq) if self._log is not None else 0
        if self._log is not None:
            self._log.close()
            self._log = None
        self._retired = reason
        logger.info("shard %d retired at delta record %d: %s", self.core.shard, seq, reason)
        return seq

    def _buckets(self, keys: np.ndarray) -> np.ndarray:
        from carls_dask.bank.hashing import bucket_of

        return bucket_of(keys, self.core.buckets)

    @_locked
    def close(self) -> None:
        """Release the delta log's writer lock."""
        if self._log is not None:
            self._log.close()
            self._log = None
