"""The :class:`KnowledgeBank` client: routes batches to shards and gathers the answers.

A batch is split by hash bucket into one sub-batch per shard, one :class:`~carls_dask.bank.transport.ShardCall`
per shard is sent through the bank's transport (all of them before any answer is awaited), and the
answers are put back in the order of the keys. The client validates every batch against the table
specs (:mod:`carls_dask.bank.schema`) before sending anything, so a bad batch reaches no shard.

Two transports carry the calls (:mod:`carls_dask.bank.transport`): Dask actors
(:meth:`KnowledgeBank.create`, :meth:`KnowledgeBank.restore`; the object is picklable and can be
passed into tasks) and shards held in this process (:meth:`KnowledgeBank.local`,
:meth:`KnowledgeBank.restore_local`; no cluster). Routing, validation, snapshots and answers are
the same code for both.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from carls_dask import config
from carls_dask.bank import stages
from carls_dask.bank.actor import BankShard
from carls_dask.bank.ann import METHODS
from carls_dask.bank.batchpass import route, take_rows
from carls_dask.bank.calls import Failed, ShardCall, fuse, payload_bytes, stamp_op_ids, unfuse
from carls_dask.bank.changes import ChangeBatch, ChangeCursor
from carls_dask.bank.core import LookupResult, gather_rows
from carls_dask.bank.hashing import bucket_of, to_int64_keys
from carls_dask.bank.operations import (
    APPLY_GRADIENTS,
    CHANGES,
    CLOSE,
    CONTAINS,
    DELETE,
    EXPORT_STATE,
    INSERTING_LOOKUP,
    KEYS,
    LOOKUP,
    RESTORE,
    ROLLBACK,
    SAMPLE_DRAW,
    SET_STEP,
    SETTLE_SNAPSHOT,
    SIZE,
    SNAPSHOT,
    SNAPSHOT_BYTES,
    STATS,
    SYNC,
    TOP_K,
    UPDATE,
    Operation,
)
from carls_dask.bank.rehoming import install_walltime_plugin, publish_table, set_base
from carls_dask.bank.sampling import SAMPLERS, NegativeSample
from carls_dask.bank.schema import (
    TableSpec,
    check_batch_size,
    check_counts,
    check_durability,
    check_gradients,
    check_keys,
    check_max_staleness,
    check_provenance,
    check_sample_size,
    check_top_k_query,
    check_update,
    unknown_table,
)
from carls_dask.bank.shard_sampler import expected_counts, split_quota
from carls_dask.bank.transport import DaskTransport, LocalTransport
from carls_dask.errors import ConfigError, InvalidArgumentError, InvalidBatchError, LifecycleError

__all__ = ["BankBatch", "BankCounters", "CheckedPush", "KnowledgeBank"]

logger = logging.getLogger(__name__)

Transport = DaskTransport | LocalTransport

#: Keys of one shard's part of a mutating batch up to which a remote shard applies it on its worker's event
#: loop (:meth:`BankShard.call_on_loop <carls_dask.bank.actor.BankShard.call_on_loop>`): such a part takes
#: milliseconds, and skipping the hop to the actor thread saves a good share of a small batch's CPU time.
_LOOP_KEYS = 32768


def _resolve(spec: TableSpec) -> TableSpec:
    if spec.is_resolved and spec.durability is not None:
        return spec
    return spec.resolve(
        optimizer=config.get("bank.optimizer"),
        learning_rate=float(config.get("bank.learning-rate")),
        initializer=config.get("bank.initializer"),
        init_scale=float(config.get("bank.init-scale")),
        durability=check_durability(config.get("bank.durability"), "carls.bank.durability"),
    )


def _owner_map(buckets: int, n_shards: int) -> np.ndarray:
    return (np.arange(buckets) % n_shards).astype(np.int32)


def _plan(what: str, tables: Sequence[TableSpec], n_shards: int | None,
          buckets: int | None) -> tuple[list[TableSpec], np.ndarray, int]:
    """Resolved specs, the bucket owner map and the bucket count of a new bank (checked)."""
    specs = [_resolve(t) for t in tables]
    if not specs:
        raise InvalidBatchError(f"{what}: no tables given; expected at least one TableSpec")
    names = [t.name for t in specs]
    if len(set(names)) != len(names):
        raise InvalidBatchError(f"{what}: duplicate table names in {names}")
    n = int(config.get("bank.shards", n_shards))
    b = int(config.get("bank.buckets", buckets))
    if n < 1 or b < n:
        raise InvalidBatchError(f"{what}: n_shards={n}, buckets={b}; expected 1 <= n_shards <= buckets")
    return specs, _owner_map(b, n), b


def shard_settings() -> dict[str, Any]:
    """Every setting a shard uses, resolved here (the driver) and passed to the shards, which read no
    configuration of their own: the delta log's group commit (``group_interval``, ``group_bytes``:
    ``carls.bank.log.*``) and disk ``reserve`` (``carls.storage.disk-reserve``), the answer buffers kept for
    reuse (``answer_buffers``: ``carls.bank.answer-buffers``), the negative sampler's rebuild thresholds
    (``sampling``: ``carls.bank.sampling.*``) and the ANN index's shape (``ann``: ``carls.bank.ann.*``)."""
    interval = config.get_seconds("bank.log.group-interval")
    if not interval > 0:
        raise ConfigError(f"carls.bank.log.group-interval: {interval!r}; expected a duration > 0 such as '10ms'")
    return {"group_interval": interval, "group_bytes": config.get_bytes("bank.log.group-bytes"),
            "reserve": config.get_bytes("storage.disk-reserve"),
            "answer_buffers": config.get_bytes("bank.answer-buffers"),
            "sampling": {"rebuild_fraction": float(config.get("bank.sampling.rebuild-fraction")),
                         "rebuild_draws": float(config.get("bank.sampling.rebuild-draws"))},
            "ann": {"nlist": int(config.get("bank.ann.nlist")), "nprobe": int(config.get("bank.ann.nprobe")),
                    "retrain_growth": float(config.get("bank.ann.retrain-growth")),
                    "pending_fraction": float(config.get("bank.ann.pending-fraction"))}}


def _shard_args(specs: Sequence[TableSpec], owner: np.ndarray, buckets: int, initial_capacity: int,
                log_root: str | None, log_sync: bool, settings: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The :class:`BankShard` arguments of each shard."""
    n = int(owner.max()) + 1
    tables = [t.to_json() for t in specs]
    return [(tables, s, n, buckets, np.flatnonzero(owner == s).tolist(), initial_capacity, log_root, log_sync,
             dict(settings)) for s in range(n)]


def _keys_in(idx: Any, keys: np.ndarray) -> int:
    """How many of the batch's keys a route holds (``slice(None)``: all)."""
    return int(keys.shape[0]) if isinstance(idx, slice) else int(idx.size)


def _rows(values: np.ndarray, idx: Any) -> np.ndarray:
    """One shard's rows of a batch's values: all of them as they are, or a gathered copy."""
    return values if isinstance(idx, slice) else take_rows(values, idx)


def _same_path(a: str, b: str) -> bool:
    import os

    return os.path.realpath(a) == os.path.realpath(b)


def _lineage(man: Mapping[str, Any], default: str) -> str:
    """The lineage a snapshot's bank had (its name when the snapshot predates lineages)."""
    meta = man.get("meta", {})
    return str(meta.get("lineage") or meta.get("name") or default)


@dataclasses.dataclass
class _Plan:
    """One operation as the calls it sends (at most one per shard) and how their answers make its result."""

    calls: list[ShardCall]
    merge: Callable[[list[Any]], Any]


@dataclasses.dataclass
class BankCounters:
    """What this bank object has sent since it was made (or :meth:`KnowledgeBank.reset_counters`).

    Attributes
    ----------
    sends
        Sends: each carries one message to each shard it involves, however many operations it holds.
    messages
        Messages to shards (a shard's operations of one send travel as one message).
    operations
        Operations carried (a lookup of one table is one operation, whatever the number of shards).
    bytes_sent, bytes_received
        Bytes of the arrays sent and answered (keys, values, gradients, rows, provenance).
    wait_s
        Seconds the callers waited for answers.
    """

    sends: int = 0
    messages: int = 0
    operations: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    wait_s: float = 0.0


class Drainable(Protocol):
    """Something that holds operations for a bank and sends them before any other call (see :meth:`KnowledgeBank.attach`)."""

    def drain(self) -> None:
        """Send what is held and wait until it has landed."""

    def stop(self) -> None:
        """Release what it runs on (the bank is closing; everything was drained)."""


@dataclasses.dataclass(frozen=True)
class CheckedPush:
    """A gradient push checked by :meth:`KnowledgeBank.check_push`: ``int64`` keys, gradients by column (cast),
    learning rate and provenance."""

    table: str
    keys: np.ndarray
    grads: dict[str, np.ndarray]
    column: str
    learning_rate: float | None
    model_step: int | None
    maker: str | None

    def joins(self, other: CheckedPush) -> bool:
        """Whether ``other`` may be sent as part of this push (same table, columns, rate and provenance)."""
        return (self.table, self.column, self.learning_rate, self.model_step, self.maker, sorted(self.grads)) == (
            other.table, other.column, other.learning_rate, other.model_step, other.maker, sorted(other.grads))

    @staticmethod
    def join(parts: Sequence[CheckedPush]) -> CheckedPush:
        """One push of every part's keys and gradients: the shard sums a key's gradients, as one update."""
        first = parts[0]
        if len(parts) == 1:
            return first
        return dataclasses.replace(first, keys=np.concatenate([p.keys for p in parts]),
                                   grads={c: np.concatenate([p.grads[c] for p in parts]) for c in first.grads})


class BankBatch:
    """Operations sent together: one message per shard, run by each shard in the order they were added.

    The bank's answer to a Redis pipeline, or to TorchRec's one input distribution for every table of a
    collection: a step that reads three tables and pushes the gradients of three sends two messages to
    each shard instead of six (or one: the pushes of a step and the reads of the next). Each method
    checks its arguments at once (a bad one raises there, and nothing is sent) and returns a
    :class:`concurrent.futures.Future` whose ``result()`` is what the bank's method of the same name
    returns, after :meth:`send`. Each operation succeeds or fails on its own, as if sent alone.

    Examples
    --------
    >>> with bank.batch() as b:                                  # doctest: +SKIP
    ...     users = b.lookup("users", user_ids, insert=True)
    ...     items = b.lookup("items", item_ids, insert=True)
    >>> users.result().values["embedding"].shape                 # doctest: +SKIP
    (1024, 32)
    """

    def __init__(self, bank: KnowledgeBank) -> None:
        self.bank = bank
        self._plans: list[tuple[_Plan | Callable[[], _Plan], concurrent.futures.Future[Any]]] = []
        self._sent = False

    def __len__(self) -> int:
        return len(self._plans)

    def _add(self, plan: _Plan | Callable[[], _Plan]) -> concurrent.futures.Future[Any]:
        if self._sent:
            raise LifecycleError(f"bank {self.bank.name!r}: this batch was sent already; expected a new bank.batch()")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._plans.append((plan, fut))
        return fut

    def lookup(self, table: str, keys: Any, columns: Sequence[str] | None = None, insert: bool = False,
               max_staleness: float | None = None, *, counts: Any = None,
               late: bool = False) -> concurrent.futures.Future[LookupResult]:
        """:meth:`KnowledgeBank.lookup`, sent with the batch.

        ``late=True`` checks and routes the keys when the batch is sent, in the sending thread (a bad argument
        is then that lookup's error): for a caller whose keys are checked already and whose batch is sent
        by another thread, such as the embedding layers' queue.
        """
        if late:
            return self._add(lambda: self.bank._plan_lookup(table, keys, columns, insert, max_staleness, counts))
        return self._add(self.bank._plan_lookup(table, keys, columns, insert, max_staleness, counts))

    def update(self, table: str, keys: Any, values: Mapping[str, Any], *, model_step: int = 0,
               maker: str = "") -> concurrent.futures.Future[int]:
        """:meth:`KnowledgeBank.update`, sent with the batch."""
        return self._add(self.bank._plan_update(table, keys, values, model_step, maker))

    def apply_gradients(self, table: str, keys: Any, grads: Mapping[str, Any] | np.ndarray,
                        column: str = "embedding", learning_rate: float | None = None, *,
                        model_step: int | None = None, maker: str | None = None) -> concurrent.futures.Future[np.ndarray]:
        """:meth:`KnowledgeBank.apply_gradients`, sent with the batch."""
        return self._add(self.bank._plan_apply_gradients(table, keys, grads, column, learning_rate, model_step,
                                                         maker))

    def push(self, build: Callable[[], CheckedPush]) -> concurrent.futures.Future[np.ndarray]:
        """A gradient push whose parts are known only when the batch is sent: ``build()`` (called by :meth:`send`)
        gives it, checked. Its place in the batch is here."""
        return self._add(lambda: self.bank._plan_push(build()))

    def delete(self, table: str, keys: Any) -> concurrent.futures.Future[np.ndarray]:
        """:meth:`KnowledgeBank.delete`, sent with the batch."""
        return self._add(self.bank._plan_delete(table, keys))

    def contains(self, table: str, keys: Any) -> concurrent.futures.Future[np.ndarray]:
        """:meth:`KnowledgeBank.contains`, sent with the batch."""
        return self._add(self.bank._plan_contains(table, keys))

    def send(self, timeout: float | None = None) -> None:
        """Send every operation (one message per shard), then set each future's result or error.

        An error that stops the whole send (a closed bank, a shard that did not come back) is set on every
        future and raised. ``timeout`` bounds each shard's answer (default the bank's call timeout).
        """
        if self._sent:
            raise LifecycleError(f"bank {self.bank.name!r}: this batch was sent already; expected a new bank.batch()")
        self._sent = True
        plans: list[tuple[_Plan, concurrent.futures.Future[Any]]] = []
        for p, fut in self._plans:
            if isinstance(p, _Plan):
                plans.append((p, fut))
                continue
            try:  # a push built now: an error in building it is its own
                plans.append((p(), fut))
            except Exception as exc:
                fut.set_exception(exc)
        if not plans:
            return
        try:
            results = self.bank._send([p for p, _ in plans], timeout)
        except BaseException as exc:
            for _, fut in plans:
                fut.set_exception(exc)
            raise
        for (_, fut), r in zip(plans, results, strict=True):
            if isinstance(r, Failed):
                fut.set_exception(r.exc)
            else:
                fut.set_result(r)

    def __enter__(self) -> BankBatch:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self.send()
            for _, fut in self._plans:  # the first error of an operation, as a direct call would raise it
                fut.result()


class KnowledgeBank:
    """A sharded knowledge bank: one :class:`~carls_dask.bank.actor.BankShard` per shard.

    Create one with :meth:`create` (Dask actors) or :meth:`local` (in this process), or from a
    snapshot with :meth:`restore` / :meth:`restore_local`; every operation takes a batch of keys
    (``int64[n]`` or strings) and returns arrays in the order of those keys.

    The operations block until the shards answer. Code running on an event loop awaits one in a thread,
    so that the loop keeps running: ``rows = await asyncio.to_thread(bank.lookup, "items", keys)``
    (any method, with its arguments as in a direct call).
    """

    def __init__(
        self,
        transport: Transport,
        tables: Sequence[TableSpec],
        *,
        buckets: int,
        owner: np.ndarray,
        name: str,
        timeout: float,
        log_root: str | None = None,
    ) -> None:
        self._transport = transport
        self._specs = {t.name: t for t in tables}
        self.buckets = int(buckets)
        self._owner = np.asarray(owner, dtype=np.int32)
        self.name = name
        #: Identity of the bank's data across restores: change-feed cursors of this lineage are valid here.
        self.lineage = name
        self.timeout = float(timeout)
        self.log_root = log_root
        self._closed = False
        self._init_process_state()

    def _init_process_state(self) -> None:
        """What belongs to this bank object in this process only (a pickled copy starts without it)."""
        self.counters = BankCounters()
        self._counter_lock = threading.Lock()
        self._attached: list[Drainable] = []
        self._draining = threading.local()
        #: ``(maker, model_step)`` recorded with gradient pushes that name neither (see :meth:`set_writer`)
        self.writer: tuple[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for k in ("counters", "_counter_lock", "_attached", "_draining", "writer"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        client: Any,
        tables: Sequence[TableSpec],
        n_shards: int | None = None,
        buckets: int | None = None,
        workers: Sequence[str] | None = None,
        name: str | None = None,
        *,
        log_root: str | None = None,
        log_sync: bool = True,
        initial_capacity: int | None = None,
        timeout: float | str | None = None,
    ) -> KnowledgeBank:
        """Start one shard actor per shard, round-robin over ``workers`` (default: all workers).

        Parameters
        ----------
        client
            A :class:`distributed.Client`.
        tables
            The bank's tables; unset defaults come from ``carls.bank``.
        n_shards, buckets
            Default ``carls.bank.shards`` and ``carls.bank.buckets``.
        workers
            Worker addresses to place shards on.
        name
            Name of the bank (used in actor keys and snapshots).
        log_root
            Bank store folder; when given every mutating batch is appended to the shard's delta log
            before the call returns.
        log_sync
            ``fdatasync`` each delta-log append.
        initial_capacity
            Rows per table a shard allocates first (``carls.bank.initial-capacity``).
        timeout
            Deadline of one call to a shard (``carls.bank.call-timeout``).
        """
        specs, owner, b = _plan("KnowledgeBank.create", tables, n_shards, buckets)
        return cls._start(
            client, specs, owner, b, workers, name or f"bank-{uuid.uuid4().hex[:8]}",
            log_root=log_root, log_sync=log_sync,
            initial_capacity=int(config.get("bank.initial-capacity", initial_capacity)),
            timeout=config.get_seconds("bank.call-timeout", timeout),
        )

    @classmethod
    def local(
        cls,
        tables: Sequence[TableSpec],
        n_shards: int | None = None,
        buckets: int | None = None,
        name: str | None = None,
        *,
        log_root: str | None = None,
        log_sync: bool = True,
        initial_capacity: int | None = None,
    ) -> KnowledgeBank:
        """A bank whose shards live in this process and are called directly (no cluster).

        The same client as :meth:`create` (validation, routing, answers, :meth:`snapshot`), over
        :class:`~carls_dask.bank.actor.BankShard` objects held by a
        :class:`~carls_dask.bank.transport.LocalTransport`. Such a bank cannot be pickled into tasks
        and is never re-homed. Parameters as in :meth:`create`.
        """
        specs, owner, b = _plan("KnowledgeBank.local", tables, n_shards, buckets)
        return cls._start_local(specs, owner, b, name or f"local-{uuid.uuid4().hex[:8]}", log_root=log_root,
                                log_sync=log_sync,
                                initial_capacity=int(config.get("bank.initial-capacity", initial_capacity)))

    @classmethod
    def _start_local(cls, specs: Sequence[TableSpec], owner: np.ndarray, buckets: int, name: str, *,
                     log_root: str | None, log_sync: bool, initial_capacity: int) -> KnowledgeBank:
        shards: list[BankShard] = []
        try:
            for a in _shard_args(specs, owner, buckets, initial_capacity, log_root, log_sync, shard_settings()):
                shards.append(BankShard(*a))
        except BaseException:
            for shard in shards:  # release the delta logs already opened
                shard.close()
            raise
        return cls(LocalTransport(shards), specs, buckets=buckets, owner=owner, name=name,
                   timeout=config.get_seconds("bank.call-timeout"), log_root=log_root)

    @classmethod
    def _start(
        cls,
        client: Any,
        specs: Sequence[TableSpec],
        owner: np.ndarray,
        buckets: int,
        workers: Sequence[str] | None,
        name: str,
        *,
        log_root: str | None,
        log_sync: bool,
        initial_capacity: int,
        timeout: float,
    ) -> KnowledgeBank:
        n = int(owner.max()) + 1
        addrs = list(workers) if workers else sorted(client.scheduler_info(n_workers=-1)["workers"])
        if not addrs:
            raise LifecycleError(f"bank {name!r}: the cluster has no workers to place {n} shards on")
        settings = shard_settings()
        args = _shard_args(specs, owner, buckets, initial_capacity, log_root, log_sync, settings)
        placed = [addrs[s % len(addrs)] for s in range(n)]
        transport = DaskTransport.start(client, name, BankShard, args, placed, timeout,
                                        config.get_seconds("bank.rehome-timeout"))
        logger.info("bank %s: %d shards on %s", name, n, sorted(set(placed)))
        publish_table(client, transport.table, [t.to_json() for t in specs], [a[4] for a in args],
                      buckets=buckets, initial_capacity=initial_capacity, log_root=log_root, log_sync=log_sync,
                      shard_settings=settings)
        if log_root is not None:
            install_walltime_plugin(client)
        return cls(transport, specs, buckets=buckets, owner=owner, name=name, timeout=timeout, log_root=log_root)

    # pickling: the transport decides what a copy carries; counters and attached queues stay here
    def __repr__(self) -> str:
        return (f"<KnowledgeBank {self.name!r}: {self.n_shards} {self._transport.kind} shards, "
                f"tables {sorted(self._specs)}>")

    # -- properties ---------------------------------------------------------------------------------
    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return self._transport.n_shards

    @property
    def transport(self) -> Transport:
        """What carries calls to the shards (:mod:`carls_dask.bank.transport`)."""
        return self._transport

    @property
    def rehome_timeout(self) -> float:
        """How long a call waits for a lost shard to come back (0 for in-process shards)."""
        return self._transport.rehome_timeout

    @rehome_timeout.setter
    def rehome_timeout(self, seconds: float) -> None:
        self._transport.rehome_timeout = float(seconds)

    @property
    def tables(self) -> dict[str, TableSpec]:
        """The (resolved) table specs by name."""
        return dict(self._specs)

    @property
    def durability(self) -> dict[str, str]:
        """Each table's durability policy (``every-write``, ``group`` or ``snapshot``; see docs/durability.md)."""
        return {name: t.durability or "every-write" for name, t in self._specs.items()}

    def spec(self, table: str) -> TableSpec:
        """The spec of ``table`` (raises :class:`UnknownTableError`)."""
        if not isinstance(table, str) or table not in self._specs:
            raise unknown_table(str(table), list(self._specs))
        return self._specs[table]

    def shard_of(self, keys: Any) -> np.ndarray:
        """Shard id of each key."""
        return self._owner[bucket_of(to_int64_keys(keys), self.buckets)]

    # -- plumbing -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise LifecycleError(f"bank {self.name!r} is closed")

    def _route(self, keys: np.ndarray) -> list[tuple[int, Any]]:
        """``(shard, positions)`` of each shard that holds keys of the batch.

        When one shard holds the whole batch its positions are ``slice(None)``, so the batch is sent
        as it is (no gather on the way out, no scatter on the way back).
        """
        everything = slice(None)
        if self.n_shards == 1:
            return [(0, everything)]
        routes = [(s, idx) for s, idx in enumerate(route(keys, self._owner, self.buckets)) if idx.size]
        stages.mark("client", "hashing and routing")
        if len(routes) == 1:
            return [(routes[0][0], everything)]
        return routes

    def _call(self, calls: Sequence[ShardCall], timeout: float | None = None) -> list[Any]:
        """The answers of the calls of one operation, in order (its mutating calls share one operation id);
        raises the first call's error."""
        answers = self._send([_Plan(list(calls), list)], timeout)[0]
        if isinstance(answers, Failed):
            raise answers.exc
        return answers

    def _run(self, plan: _Plan, timeout: float | None = None) -> Any:
        """Send one operation and return its result (raises its error)."""
        out = self._send([plan], timeout)[0]
        if isinstance(out, Failed):
            raise out.exc
        return out

    def _send(self, plans: Sequence[_Plan], timeout: float | None = None) -> list[Any]:
        """Send operations, each shard's calls as one message, and return each result (or its :class:`Failed`).

        The one path of every operation. Each operation's mutating calls get one operation id of their own.
        Queues attached to this bank (:meth:`attach`) are drained first, so the call sees every operation
        they held. ``timeout`` bounds each shard's answer (default the call timeout).
        """
        self._check_open()
        if self._attached:
            self.flush()
        calls: list[ShardCall] = []
        spans = []
        for p in plans:
            spans.append((len(calls), len(calls) + len(p.calls)))
            calls.extend(stamp_op_ids(p.calls))
        sent, where = fuse(calls)
        stages.mark("client", "building calls")
        t0 = time.perf_counter()
        answers = unfuse(self._transport.call(sent, self.timeout if timeout is None else timeout), where)
        waited = time.perf_counter() - t0
        with self._counter_lock:
            c = self.counters
            c.sends += 1
            c.messages += len(sent)
            c.operations += len(plans)
            c.bytes_sent += sum(payload_bytes(x.args) + payload_bytes(x.kwargs) for x in sent)
            c.bytes_received += payload_bytes(answers)
            c.wait_s += waited
        out: list[Any] = []
        for p, (a, b) in zip(plans, spans, strict=True):
            part = answers[a:b]
            failed = next((x for x in part if isinstance(x, Failed)), None)
            if failed is not None:
                out.append(failed)
                continue
            try:
                out.append(p.merge(part))
            except Exception as exc:  # answers that cannot be put together: that operation's error
                out.append(Failed(exc))
        return out

    def batch(self) -> BankBatch:
        """Operations to send together, one message per shard (see :class:`BankBatch`)."""
        self._check_open()
        return BankBatch(self)

    def attach(self, queue: Drainable) -> None:
        """Have every call through this bank object first drain ``queue`` (which holds operations for it).

        A layer's queue (:mod:`carls_dask.nn.pipeline`) holds gradient pushes until the next call it
        sends; attached, any other call in this process (``bank.lookup``, a snapshot) sees them first.
        """
        if queue not in self._attached:
            self._attached.append(queue)

    def detach(self, queue: Drainable) -> None:
        """Stop draining ``queue`` before calls."""
        if queue in self._attached:
            self._attached.remove(queue)

    def sending_for_queue(self) -> Any:
        """A context in which this thread's calls do not drain attached queues (the queue's own sends)."""
        return _Draining(self._draining)

    def reset_counters(self) -> BankCounters:
        """Return the counters so far and start new ones."""
        with self._counter_lock:
            out, self.counters = self.counters, BankCounters()
        return out

    def set_writer(self, maker: str | None, model_step: int | None = None) -> None:
        """Provenance of gradient pushes that give none: the trainer's name and step (None: keep the rows').

        The runtime sets it before each of a trainer's steps, so rows a layer's backward trains read
        that trainer and step in ``bank.lookup(...).model_step`` and the dashboard's bank health.
        """
        if maker is None:
            self.writer = None
            return
        check_provenance("(writer)", int(model_step or 0), maker)
        self.writer = (str(maker), int(model_step or 0))

    def _every_shard(self, op: Operation, *args: Any, timeout: float | None = None) -> list[Any]:
        """Operation ``op`` with ``args`` on every shard (one answer per shard, in shard order)."""
        if op.routing != "every" or op.mutating:
            raise InvalidArgumentError(f"bank {self.name!r}: {op!r} is not sent to every shard without an operation "
                                       "id; expected an operation routed to every shard")
        return self._call([ShardCall(s, op, args) for s in range(self.n_shards)], timeout)

    @staticmethod
    def _keyed_plan(routes: Sequence[tuple[int, Any]], make: Callable[[int, Any], ShardCall], n: int) -> _Plan:
        """One call per route; the answers merged as the operation says: a ``"mask"`` scattered back into
        ``bool[n]`` in key order, a ``"sum"`` added up."""
        calls = [make(s, idx) for s, idx in routes]
        how = calls[0].op.merge if calls else "mask"

        def merge(parts: list[Any]) -> Any:
            if how == "sum":
                return int(sum(parts))
            out = np.empty(n, dtype=bool)
            for (_, idx), p in zip(routes, parts, strict=True):
                out[idx] = p
            stages.mark("client", "reassembly")
            return out

        return _Plan(calls, merge)

    def _keys(self, table: str, keys: Any) -> np.ndarray:
        check_batch_size(table, "keys", len(keys) if hasattr(keys, "__len__") and not isinstance(keys, str | bytes) else 1)
        return check_keys(table, to_int64_keys(keys, table))

    # -- operations ---------------------------------------------------------------------------------
    def lookup(
        self,
        table: str,
        keys: Any,
        columns: Sequence[str] | None = None,
        insert: bool = False,
        max_staleness: float | None = None,
        *,
        counts: Any = None,
    ) -> LookupResult:
        """Read rows of ``keys`` in order (see :meth:`ShardCore.lookup`); missing keys are flagged in ``found``.

        With ``insert=True`` missing keys are allocated with the deterministic initializer and every
        occurrence of a key adds one to its frequency -- or, with ``counts`` (``int64[n]``, >= 1), adds
        ``counts[i]`` for ``keys[i]``: a caller that sends each key once says how often it occurred.
        """
        return self._run(self._plan_lookup(table, keys, columns, insert, max_staleness, counts))

    def _plan_lookup(self, table: str, keys: Any, columns: Sequence[str] | None, insert: bool,
                     max_staleness: float | None, counts: Any = None) -> _Plan:
        stages.begin()
        spec = self.spec(table)
        names = list(spec.column_names) if columns is None else [spec.column(c).name for c in columns]
        check_max_staleness(table, max_staleness)
        k = self._keys(table, keys)
        c = None if counts is None else check_counts(table, counts, k.shape[0])
        stages.mark("client", "key conversion")
        routes = self._route(k)
        split = [(s, k[idx], None if c is None else c[idx]) for s, idx in routes]
        stages.mark("client", "splitting")
        if insert:  # allocates and counts: a mutating batch
            calls = [ShardCall(s, INSERTING_LOOKUP, (table, ks, names), {"insert": True} if cs is None else
                               {"insert": True, "counts": cs}, on_loop=ks.size <= _LOOP_KEYS)
                     for s, ks, cs in split]
        else:  # a read, which a remote shard serves on its worker's event loop
            calls = [ShardCall(s, LOOKUP, (table, ks, names), on_loop=True) for s, ks, _ in split]

        def merge(parts: list[Any]) -> LookupResult:
            if len(routes) == 1:
                out = parts[0].result(max_staleness)
            else:
                out = gather_rows([(idx, r) for (_, idx), r in zip(routes, parts, strict=True)], k.shape[0],
                                  {c: spec.column(c) for c in names}, max_staleness)
            stages.mark("client", "reassembly")
            return out

        return _Plan(calls, merge)

    def update(
        self,
        table: str,
        keys: Any,
        values: Mapping[str, Any],
        *,
        model_step: int = 0,
        maker: str = "",
    ) -> int:
        """Write column values (upsert; last write wins within a batch); returns distinct keys written."""
        return int(self._run(self._plan_update(table, keys, values, model_step, maker)))

    def _plan_update(self, table: str, keys: Any, values: Mapping[str, Any], model_step: int, maker: str) -> _Plan:
        stages.begin()
        spec = self.spec(table)
        k = self._keys(table, keys)
        stages.mark("client", "key conversion")
        checked = check_update(spec, k.shape[0], values, model_step, maker)
        stages.mark("client", "validation")
        routes = self._route(k)
        split = [(s, k[idx], {c: _rows(v, idx) for c, v in checked.items()}) for s, idx in routes]
        stages.mark("client", "splitting")
        parts = {s: (ks, vs) for s, ks, vs in split}
        return self._keyed_plan(routes, lambda s, _: ShardCall(s, UPDATE, (table, *parts[s], int(model_step), maker),
                                                               on_loop=parts[s][0].size <= _LOOP_KEYS), k.shape[0])

    def apply_gradients(
        self,
        table: str,
        keys: Any,
        grads: Mapping[str, Any] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
        *,
        model_step: int | None = None,
        maker: str | None = None,
    ) -> np.ndarray:
        """Apply the table's optimizer on the shards (duplicate keys' gradients are summed).

        ``model_step`` and ``maker`` become the updated rows' provenance (default: this bank object's
        :meth:`writer <set_writer>`, else the rows keep theirs).

        Returns ``bool[n]``: which keys were present and updated (absent keys are skipped, as in CARLS).
        """
        return self._run(self._plan_apply_gradients(table, keys, grads, column, learning_rate, model_step,
                                                    maker))

    def _plan_apply_gradients(self, table: str, keys: Any, grads: Mapping[str, Any] | np.ndarray, column: str,
                              learning_rate: float | None, model_step: int | None, maker: str | None) -> _Plan:
        return self._plan_push(self.check_push(table, keys, grads, column, learning_rate, model_step, maker))

    def check_push(self, table: str, keys: Any, grads: Mapping[str, Any] | np.ndarray, column: str = "embedding",
                   learning_rate: float | None = None, model_step: int | None = None,
                   maker: str | None = None) -> CheckedPush:
        """Check an :meth:`apply_gradients` batch without sending it: its keys, gradients and provenance, converted.

        Raises what :meth:`apply_gradients` raises for bad input. Checked pushes of one table may be
        joined (:meth:`CheckedPush.join`) and sent with :meth:`BankBatch.push`.
        """
        stages.begin()
        spec = self.spec(table)
        k = self._keys(table, keys)
        stages.mark("client", "key conversion")
        checked, _ = check_gradients(spec, k.shape[0], grads, column, learning_rate)
        check_provenance(table, model_step, maker, optional=True)
        if model_step is None and maker is None and self.writer is not None:
            maker, model_step = self.writer
        stages.mark("client", "validation")
        return CheckedPush(table, k, checked, column, learning_rate, None if model_step is None else int(model_step),
                           maker)

    def _plan_push(self, p: CheckedPush) -> _Plan:
        routes = self._route(p.keys)
        split = {s: (p.keys[idx], {c: _rows(v, idx) for c, v in p.grads.items()}) for s, idx in routes}
        stages.mark("client", "splitting")
        return self._keyed_plan(
            routes,
            lambda s, idx: ShardCall(s, APPLY_GRADIENTS, (p.table, *split[s], p.column, p.learning_rate,
                                                            p.model_step, p.maker),
                                     on_loop=split[s][0].size <= _LOOP_KEYS),
            p.keys.shape[0],
        )

    def delete(self, table: str, keys: Any) -> np.ndarray:
        """Remove keys; returns ``bool[n]``, True where the key was present."""
        return self._run(self._plan_delete(table, keys))

    def _plan_delete(self, table: str, keys: Any) -> _Plan:
        self.spec(table)
        k = self._keys(table, keys)
        return self._keyed_plan(self._route(k), lambda s, idx: ShardCall(s, DELETE, (table, k[idx]),
                                                                         on_loop=_keys_in(idx, k) <= _LOOP_KEYS),
                               k.shape[0])

    def contains(self, table: str, keys: Any) -> np.ndarray:
        """``bool[n]``: whether each key is present (frequency untouched)."""
        return self._run(self._plan_contains(table, keys))

    def _plan_contains(self, table: str, keys: Any) -> _Plan:
        self.spec(table)
        k = self._keys(table, keys)
        return self._keyed_plan(self._route(k),
                               lambda s, idx: ShardCall(s, CONTAINS, (table, k[idx]), on_loop=True), k.shape[0])

    def size(self, table: str | None = None) -> int:
        """Rows in ``table`` (or in all tables) over all shards."""
        if table is not None:
            self.spec(table)
        return int(sum(self._every_shard(SIZE, table)))

    def keys(self, table: str) -> np.ndarray:
        """All keys of ``table`` (shard by shard)."""
        self.spec(table)
        parts = self._every_shard(KEYS, table)
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def changes(
        self, table: str, since: ChangeCursor | None = None, *, column: str | None = None, limit: int | None = None,
    ) -> ChangeBatch:
        """The keys whose watched ``column`` moved since cursor ``since``, in one batched call over the shards.

        ``since=None`` starts a consumer: it gets every present key and a cursor. The table must watch
        the column (:attr:`TableSpec.watch <carls_dask.bank.schema.TableSpec.watch>`); ``column`` may be
        left out when it watches one. A cursor stays valid across a restore (on any shard count) and a
        re-homed shard: a shard whose state was rebuilt answers all its keys once, so keys may repeat
        but none is lost. ``limit`` bounds the keys of each shard's answer (whole write batches are
        kept together); :attr:`ChangeBatch.complete` then says whether to ask again.

        Raises
        ------
        InvalidBatchError
            For a table or column that is not watched, a cursor of another bank, table or column, or a
            cursor position no shard gave out; nothing changes.
        """
        spec = self.spec(table)
        if not spec.watch:
            raise InvalidBatchError(f"bank {self.name!r}: table {table!r} watches no column (TableSpec.watch is empty)")
        watched = [w.column for w in spec.watch]
        if column is None:
            if len(watched) != 1:
                raise InvalidBatchError(f"bank {self.name!r}: table {table!r} watches {watched}; name the column")
            column = watched[0]
        if column not in watched:
            raise InvalidBatchError(f"bank {self.name!r}: table {table!r} does not watch column {column!r}; "
                                    f"watched: {watched}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | np.integer) or limit < 1):
            raise InvalidBatchError(f"bank {self.name!r}: changes limit must be an integer >= 1, got {limit!r}")
        positions: list[tuple[str, int] | None] = [None] * self.n_shards
        if since is not None:
            if not isinstance(since, ChangeCursor):
                raise InvalidBatchError(f"bank {self.name!r}: since must be a ChangeCursor from changes(), "
                                        f"got {type(since).__name__}")
            if since.bank != self.lineage:
                raise InvalidBatchError(f"bank {self.name!r}: the cursor belongs to bank {since.bank!r}; "
                                        f"expected one of this bank ({self.lineage!r})")
            if (since.table, since.column) != (table, column):
                raise InvalidBatchError(f"bank {self.name!r}: the cursor follows {since.table}/{since.column}; "
                                        f"expected {table}/{column}")
            if len(since.shards) == self.n_shards:  # else (a restore on another shard count) every shard answers all
                positions = [(str(e), int(q)) for e, q in since.shards]
        answers = self._call([ShardCall(s, CHANGES, (table, column, positions[s], limit))
                              for s in range(self.n_shards)])
        keys = [np.asarray(a[0], dtype=np.int64) for a in answers]
        cursor = ChangeCursor(self.lineage, table, column, tuple((str(a[1][0]), int(a[1][1])) for a in answers))
        return ChangeBatch(np.concatenate(keys) if keys else np.empty(0, dtype=np.int64), cursor,
                           all(bool(a[2]) for a in answers))

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
        """Sample ``n`` candidate keys of ``table`` with expected counts (logQ correction), at ``O(n)`` per call.

        The sample is a mixture over shards: the client asks every shard for its row count, splits ``n``
        among the shards by a multinomial draw in proportion to their rows (with ``unique``, capped at each
        shard's rows), and each shard samples its share (see :meth:`ShardCore.sample_draw`): ``uniform``
        over its rows, ``log_uniform`` over its own frequency ranks. A key of shard ``s`` (``n_s`` of
        ``N`` rows, one-draw probability ``p_s`` there) has the expected count ``n * n_s / N * p_s``
        with replacement -- exactly that of the mixture -- and TensorFlow's
        ``1 - (1 - p_s) ** num_tries_s`` with ``unique``, from its shard's draws; ``num_tries`` is the
        sum over shards. With ``exclude_true`` no true key is returned (each shard conditions its
        distribution on not drawing one; see :meth:`ShardCore.sample_negatives`). With hashed keys, rank ``r`` within a shard stands for about rank ``r * shards``
        of the bank, so the mixture is close to one log-uniform over the bank's ranks.
        """
        self.spec(table)
        n = check_sample_size(table, n)
        if sampler not in SAMPLERS:
            raise InvalidBatchError(f"table {table!r}: sampler {sampler!r} is unknown; expected one of {SAMPLERS}")
        if n <= 0:
            raise InvalidBatchError(f"table {table!r}: sample size must be positive, got n={n}")
        rows = [int(r) for r in self._every_shard(SIZE, table)]
        total = sum(rows)
        if total == 0:
            raise InvalidBatchError(f"table {table!r}: cannot sample from an empty table")
        if unique and n > total:
            raise InvalidBatchError(
                f"table {table!r}: asked for {n} unique candidates but the table holds only {total} keys"
            )
        rng = np.random.default_rng(seed)
        tk = None if true_keys is None else check_keys(table, to_int64_keys(true_keys, table), allow_empty=True)
        routes = dict(self._route(tk)) if tk is not None and tk.size else {}
        room = list(rows)
        if exclude_true:  # a shard can give at most its rows less its true keys
            room = [max(r - (np.unique(tk[routes[s]]).size if s in routes and tk is not None else 0), 0)
                    for s, r in enumerate(rows)]
            if unique and n > sum(room):
                raise InvalidBatchError(f"table {table!r}: asked for {n} unique candidates but only "
                                        f"{sum(room)} of {total} keys are not true keys")
        quota = split_quota(n, room, unique, rng)  # mixture weights: rows (less true keys when they are excluded)
        weight = sum(room)
        seeds = rng.integers(0, 2**63 - 1, size=self.n_shards)
        calls, who = [], []
        for s in range(self.n_shards):
            if quota[s] > 0:
                idx = routes.get(s)
                calls.append(ShardCall(s, SAMPLE_DRAW, (table, int(quota[s]), sampler, unique,
                                                           None if idx is None or tk is None else tk[idx], int(seeds[s]),
                                                           exclude_true)))
                who.append(s)
        draws = self._call(calls)
        keys, expected = [], []
        true_expected = np.zeros(0 if tk is None else tk.shape[0], dtype=np.float64)
        tries = 0
        for s, d in zip(who, draws, strict=True):
            share = room[s] / weight
            keys.append(d.keys)
            if unique:
                expected.append(expected_counts(n, True, d.num_tries, d.prob))
            else:
                expected.append(n * share * d.prob)
            if s in routes:
                tp = expected_counts(n, True, d.num_tries, d.true_prob) if unique else n * share * d.true_prob
                true_expected[routes[s]] = tp
            tries += d.num_tries
        if tk is not None and not unique:  # true keys of shards that drew nothing still have a probability
            rest = [s for s in routes if quota[s] == 0 and rows[s] > 0]
            if rest:
                probs = self._call([ShardCall(s, SAMPLE_DRAW, (table, 1, sampler, False, tk[routes[s]], 0))
                                    for s in rest])
                for s, d in zip(rest, probs, strict=True):
                    true_expected[routes[s]] = n * room[s] / weight * d.true_prob
        return NegativeSample(keys=np.concatenate(keys).astype(np.int64), expected_count=np.concatenate(expected),
                              true_expected_count=true_expected, num_tries=int(tries))

    def top_k(
        self, table: str, query: Any, k: int, column: str = "embedding", metric: str = "dot",
        method: str = "exact",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k keys by dot product or cosine, merged across shards: ``(keys[q, k], scores[q, k])``.

        ``method="exact"`` searches every row; ``method="ivf"`` searches each shard's FAISS IVF index of
        the column (approximate, kept current as rows change; ``carls.bank.ann.*`` sets its shape), and the
        shards' answers are merged the same way.

        Raises
        ------
        InvalidBatchError
            If the table holds fewer than ``k`` usable rows (CARLS needs exactly ``k`` results).
        """
        q = np.asarray(query)
        q = check_top_k_query(self.spec(table), q[None, :] if q.ndim == 1 else q, k, column, metric)
        if method not in METHODS:
            raise InvalidBatchError(f"table {table!r}: top_k method {method!r} is unknown; expected one of {METHODS}")
        parts = self._every_shard(TOP_K, table, q, int(k), column, metric, method)
        keys = np.concatenate([p[0] for p in parts], axis=1)
        scores = np.concatenate([p[1] for p in parts], axis=1)
        if keys.shape[1] < int(k):
            raise InvalidBatchError(
                f"table {table!r}: top_k asked for k={k} but only {keys.shape[1]} rows are usable ({metric})"
            )
        order = np.lexsort((keys, -scores), axis=1)[:, : int(k)]
        return np.take_along_axis(keys, order, axis=1), np.take_along_axis(scores, order, axis=1)

    def stats(self) -> dict[str, Any]:
        """Rows and memory per shard and table, plus totals."""
        per = self._every_shard(STATS)
        totals: dict[str, dict[str, int]] = {}
        for st in per:
            for t, info in st["tables"].items():
                tot = totals.setdefault(t, {"rows": 0, "bytes_allocated": 0, "bytes_used": 0})
                for f in tot:
                    tot[f] += int(info[f])
        return {"name": self.name, "n_shards": self.n_shards, "buckets": self.buckets, "shards": per, "tables": totals,
                "transport": self._transport.kind, "rehoming": self._transport.rehoming()}

    def set_step(self, step: int) -> None:
        """Tell every shard the current training step (recorded with delta-log records)."""
        self._every_shard(SET_STEP, int(step))

    def sync(self) -> None:
        """Make every acknowledged write durable now: each shard ``fdatasync``-s what its ``group`` tables logged
        since their last group sync (one sync per shard serves every caller waiting on it)."""
        self._every_shard(SYNC)

    def rollback(self, root: str, version: int | None = None, tables: Sequence[str] | None = None) -> int:
        """Bring the tables kept by snapshots alone back to snapshot ``version`` of ``root`` on every shard.

        The bank's half of a consistent cut after a shard holding such tables was lost: the re-homed shard
        brought them back at the newest snapshot and refuses their writes (:class:`~carls_dask.errors.RolledBackError`)
        until every shard holds them as of the same snapshot, which this does; their writers (a trainer)
        then continue from their state at the snapshot's step. A run's Workbench calls it itself.

        Parameters
        ----------
        root
            The bank store (the bank's ``log_root``).
        version
            The snapshot (default the newest); a negative version (or a store without a snapshot) brings the
            tables back empty, as before any snapshot.
        tables
            The tables (default every table whose durability is ``snapshot``).

        Returns
        -------
        int
            The step of the snapshot (0 without one).
        """
        from carls_dask.storage.manifest import list_snapshots, read_manifest

        names = [t for t, p in self.durability.items() if p == "snapshot"] if tables is None else list(tables)
        for t in names:
            self.spec(t)
        empty = version is not None and int(version) < 0
        snaps = [] if empty else list_snapshots(root)
        man = read_manifest(root, version) if snaps or (version is not None and not empty) else None
        v = None if man is None else int(man["version"])
        if names:
            self._every_shard(ROLLBACK, str(root), v, names, timeout=10 * self.timeout)
        logger.info("bank %s: tables %s rolled back to snapshot v%s of %s", self.name, names, v, root)
        return 0 if man is None else int(man["step"])

    # -- persistence --------------------------------------------------------------------------------
    def export_state(self) -> list[dict[str, Any]]:
        """Every shard's whole state, as :meth:`ShardCore.export_state <carls_dask.bank.core.ShardCore.export_state>`
        returns it, in shard order.

        Each entry holds ``meta`` (its ``makers`` list names the codes of its ``prov/maker`` arrays) and
        ``tables``: per table, row-aligned copies of ``keys``, ``bucket``, ``frequency``, ``prov/*``,
        ``col/*`` and ``slot/<column>/<slot>``. Rows come in each shard's storage order. Everything
        is copied to the client, so this is meant for tests, checks and small banks.
        """
        return self._every_shard(EXPORT_STATE)

    def snapshot(self, root: str, step: int, *, full: bool | None = None, timeout: float | None = None,
                 **snapshot_kwargs: Any) -> int:
        """Write a committed snapshot of every shard under ``root``; returns its version.

        Each shard writes its own arrays (concurrently); the snapshot is committed only when all
        have written, so a failure leaves the previous snapshot the newest valid one. ``timeout``
        bounds each shard's write (default: ten times the call timeout). All optimizer state is kept
        per row (the slots, Adam's per-row ``step`` among them), so the rows are the whole state.

        Snapshots are incremental: a shard writes only the rows changed and keys deleted since the newest
        snapshot of ``root`` when it wrote that one (see :meth:`BankShard.snapshot
        <carls_dask.bank.actor.BankShard.snapshot>`). Every ``carls.bank.snapshot-compact-every`` increments,
        or once the increments hold more than ``carls.bank.snapshot-compact-fraction`` of the rows, the
        snapshot is full again (a new base). ``full=True`` forces a full one, ``full=False`` skips those
        limits (a shard still writes in full when it has nothing to build on).
        """
        from carls_dask.storage.bankstore import next_parent
        from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot

        kwargs = {
            "chunk_rows": int(config.get("storage.chunk-rows")),
            "compressor": config.get("storage.compressor"),
            **snapshot_kwargs,
        }
        fraction = float(config.get("bank.snapshot-compact-fraction"))
        parent = None
        if full is not True:
            every = 1 << 30 if full is False else int(config.get("bank.snapshot-compact-every"))
            parent = next_parent(root, every, float("inf") if full is False else fraction)
        self._check_snapshot_room(root, parent, full, fraction)
        handle = begin_snapshot(root, int(step), parent=parent, **kwargs)
        self._every_shard(SET_STEP, int(step))
        try:
            self._every_shard(SNAPSHOT, handle, bool(full), fraction,
                              timeout=10 * self.timeout if timeout is None else timeout)
            entry = commit_snapshot(
                handle,
                {
                    "name": self.name,
                    "lineage": self.lineage,
                    "n_shards": self.n_shards,
                    "buckets": self.buckets,
                    "tables": {t: s.to_json() for t, s in self._specs.items()},
                },
            )
        finally:
            try:  # each shard learns whether its part was committed (else its changes count again)
                self._every_shard(SETTLE_SNAPSHOT)
            except Exception:  # a shard settles at its next snapshot anyway
                logger.warning("bank %s: a shard could not settle snapshot v%d", self.name, handle.version,
                               exc_info=True)
        if self.log_root is not None and _same_path(root, self.log_root):
            from carls_dask.storage.bankstore import truncate_log

            truncate_log(root, str(config.get("storage.log-history")))
        return int(entry["version"])

    def _check_snapshot_room(self, root: str, parent: int | None, full: bool | None, fraction: float) -> None:
        """Refuse a snapshot that would take ``root``'s disk below ``carls.storage.disk-reserve``, before it begins."""
        from carls_dask.storage.fsutil import check_reserve

        reserve = config.get_bytes("storage.disk-reserve")
        if reserve <= 0:
            return
        need = sum(int(b) for b in self._every_shard(SNAPSHOT_BYTES, str(root), parent, bool(full), fraction))
        check_reserve(root, need, reserve, f"bank {self.name!r}: snapshot into {root}")

    @classmethod
    def restore(
        cls,
        client: Any,
        root: str,
        n_shards: int | None = None,
        version: int | None = None,
        workers: Sequence[str] | None = None,
        *,
        name: str | None = None,
        log_root: str | None = None,
        log_sync: bool = True,
        replay_log: bool = True,
        timeout: float | str | None = None,
    ) -> KnowledgeBank:
        """Start a bank of Dask actors from snapshot ``version`` (newest by default) of ``root``, on any shard count.

        Each new shard reads the rows of the buckets it owns from the snapshot and then replays the
        delta log recorded after it (``replay_log``). Optimizer slots and provenance come back exactly.
        :meth:`restore_local` does the same into in-process shards.
        """
        man, specs, owner, buckets = cls._read_plan(root, version, n_shards)
        t = config.get_seconds("bank.call-timeout", timeout)
        bank = cls._start(
            client, specs, owner, buckets, workers, cls._restored_name(man, name, "bank"),
            log_root=log_root, log_sync=log_sync,
            initial_capacity=int(config.get("bank.initial-capacity")), timeout=t,
        )
        bank.lineage = _lineage(man, bank.name)
        bank._load(root, man, replay_log, 10 * t)
        if log_root is not None and str(log_root) != str(root):
            set_base(client, bank.name, str(root), int(man["version"]))
        return bank

    @classmethod
    def restore_local(
        cls,
        root: str,
        n_shards: int | None = None,
        version: int | None = None,
        *,
        name: str | None = None,
        log_root: str | None = None,
        log_sync: bool = True,
        replay_log: bool = True,
    ) -> KnowledgeBank:
        """Start an in-process bank (as :meth:`local`) from snapshot ``version`` of ``root``, on any shard count.

        The same as :meth:`restore` without a cluster: each shard reads its buckets' rows and
        replays the delta log recorded after the snapshot (``replay_log``).
        """
        man, specs, owner, buckets = cls._read_plan(root, version, n_shards)
        bank = cls._start_local(specs, owner, buckets, cls._restored_name(man, name, "local"), log_root=log_root,
                                log_sync=log_sync, initial_capacity=int(config.get("bank.initial-capacity")))
        bank.lineage = _lineage(man, bank.name)
        bank._load(root, man, replay_log, None)
        return bank

    @staticmethod
    def _read_plan(root: str, version: int | None,
                   n_shards: int | None) -> tuple[dict[str, Any], list[TableSpec], np.ndarray, int]:
        """The manifest of the snapshot to restore, its table specs, the new owner map and bucket count."""
        from carls_dask.storage.snapshots import read_manifest

        man = read_manifest(root, version)
        from carls_dask.storage.bankview import table_order

        declared = man.get("meta", {})["tables"]
        order = [t for t in table_order(man) if t in declared]  # the order the bank was created with them
        specs = [TableSpec.from_json(declared[t]) for t in [*order, *(t for t in declared if t not in order)]]
        buckets = int(man["buckets"])
        n = int(n_shards if n_shards is not None else man["n_shards"])
        if n < 1 or n > buckets:
            raise InvalidBatchError(f"restore of {root}: n_shards={n}; expected 1 <= n_shards <= {buckets}")
        return man, specs, _owner_map(buckets, n), buckets

    @staticmethod
    def _restored_name(man: Mapping[str, Any], name: str | None, prefix: str) -> str:
        if name:
            return name
        return str(man.get("meta", {}).get("name", f"{prefix}-{uuid.uuid4().hex[:8]}")) + f"-r{uuid.uuid4().hex[:4]}"

    def _load(self, root: str, man: Mapping[str, Any], replay_log: bool, timeout: float | None) -> None:
        """Have every (new, empty) shard read its rows from snapshot ``man`` of ``root``; closes the bank on failure."""
        try:
            done = self._every_shard(RESTORE, str(root), int(man["version"]), replay_log, timeout=timeout)
        except BaseException:
            self.close()
            raise
        logger.info("bank %s restored from v%d of %s: %s", self.name, man["version"], root, done)

    def close(self) -> None:
        """Release the shards (their delta logs are closed first). Idempotent."""
        if self._closed:
            return
        try:
            if self._transport.owns_shards:
                self._every_shard(CLOSE)
            else:
                self.flush()
        finally:
            self._closed = True
            for q in self._attached:
                q.stop()
            self._attached = []
            self._transport.release()

    def flush(self) -> None:
        """Send what the queues attached to this bank object hold (a layer's gradient pushes) and wait for it."""
        if not getattr(self._draining, "on", False):
            for q in list(self._attached):
                q.drain()

    def __enter__(self) -> KnowledgeBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Draining:
    """Marks this thread's calls as a queue's own sends while the block runs (see :meth:`KnowledgeBank.attach`)."""

    def __init__(self, local: threading.local) -> None:
        self.local = local

    def __enter__(self) -> None:
        self.prior = getattr(self.local, "on", False)
        self.local.on = True

    def __exit__(self, *exc: object) -> None:
        self.local.on = self.prior
