"""The :class:`KnowledgeBank` client: routes batches to shard actors and gathers the answers.

A batch is split by hash bucket into one sub-batch per shard, the calls to all shards are issued
before any answer is awaited, and the answers are put back in the order of the keys. The client
validates every batch against the table specs before sending anything, so a bad batch reaches no
shard. The object is picklable: it carries the actor handles and can be passed into tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask import config
from carls_dask.bank.actor import BankShard
from carls_dask.bank.core import LookupResult, gather_rows
from carls_dask.bank.hashing import bucket_of, to_int64_keys
from carls_dask.bank.optimizers import compute_dtype
from carls_dask.bank.rehoming import (
    adopt_or_rehome,
    forget_table,
    install_walltime_plugin,
    is_lost,
    publish_table,
    rehome_stats,
    run_on_loop,
    set_base,
    watch_all,
    with_op_ids,
)
from carls_dask.bank.sampling import NegativeSample, order_by_frequency, sample_candidates
from carls_dask.bank.schema import TableSpec, check_batch_size, coerce_column_values, unknown_table
from carls_dask.storage.errors import (
    DeadlineExceeded,
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    LifecycleError,
    ShardLostError,
)

__all__ = ["KnowledgeBank"]

logger = logging.getLogger(__name__)


def _resolve(spec: TableSpec) -> TableSpec:
    if spec.is_resolved:
        return spec
    return spec.resolve(
        optimizer=config.get("bank.optimizer"),
        learning_rate=float(config.get("bank.learning-rate")),
        initializer=config.get("bank.initializer"),
        init_scale=float(config.get("bank.init-scale")),
    )


def _owner_map(buckets: int, n_shards: int) -> np.ndarray:
    return (np.arange(buckets) % n_shards).astype(np.int32)


class _Failed:
    """A shard call that raised (kept apart so that the other shards' answers are not lost)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __await__(self) -> Any:  # awaiting a call that could not even be issued raises its error
        raise self.exc


class _Deferred:
    """A remote shard call sent when awaited on the event loop, so all of a batch's calls go out in one hop.

    Calling an actor method through its handle costs a hop to the event loop per call (and one more
    to wait); this sends the same ``actor_execute`` request from the loop, with the handle's handling
    of a lost connection (wait for the actor's future if it is still pending and retry, else
    ``OSError("Unable to contact Actor's worker")``).
    """

    __slots__ = ("args", "handle", "kwargs", "method")

    def __init__(self, handle: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.handle, self.method, self.args, self.kwargs = handle, method, args, kwargs

    def __await__(self) -> Any:
        return self._run().__await__()

    async def _run(self) -> Any:
        from distributed.protocol import to_serialize

        h = self.handle
        while True:
            try:
                result = await h._worker_rpc.actor_execute(
                    function=self.method,
                    actor=h.key,
                    args=[to_serialize(a) for a in self.args],
                    kwargs={k: to_serialize(v) for k, v in self.kwargs.items()},
                )
            except OSError:
                if h._future is not None and not h._future.done():
                    await h._future
                    continue
                raise OSError("Unable to contact Actor's worker") from None
            if result["status"] == "OK":
                return result["result"]
            raise result["exception"]


class KnowledgeBank:
    """A sharded knowledge bank: one :class:`~carls_dask.bank.actor.BankShard` actor per shard.

    Create one with :meth:`create` (or :meth:`restore`); every operation takes a batch of keys
    (``int64[n]`` or strings) and returns arrays in the order of those keys. Each method has an
    awaitable ``*_async`` form.
    """

    def __init__(
        self,
        shards: Sequence[Any],
        tables: Sequence[TableSpec],
        *,
        buckets: int,
        owner: np.ndarray,
        name: str,
        timeout: float,
        futures: Sequence[Any] = (),
        log_root: str | None = None,
    ) -> None:
        self._shards = list(shards)
        self._specs = {t.name: t for t in tables}
        self.buckets = int(buckets)
        self._owner = np.asarray(owner, dtype=np.int32)
        self.name = name
        self.timeout = float(timeout)
        self._futures = list(futures)
        self.log_root = log_root
        self.rehome_timeout = config.get_seconds("bank.rehome-timeout")
        self._closed = False

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
        specs = [_resolve(t) for t in tables]
        if not specs:
            raise InvalidBatchError("KnowledgeBank.create: no tables given; expected at least one TableSpec")
        names = [t.name for t in specs]
        if len(set(names)) != len(names):
            raise InvalidBatchError(f"KnowledgeBank.create: duplicate table names in {names}")
        n = int(config.get("bank.shards", n_shards))
        b = int(config.get("bank.buckets", buckets))
        if n < 1 or b < n:
            raise InvalidBatchError(
                f"KnowledgeBank.create: n_shards={n}, buckets={b}; expected 1 <= n_shards <= buckets"
            )
        owner = _owner_map(b, n)
        return cls._start(
            client, specs, owner, b, workers, name or f"bank-{uuid.uuid4().hex[:8]}",
            log_root=log_root, log_sync=log_sync,
            initial_capacity=int(config.get("bank.initial-capacity", initial_capacity)),
            timeout=config.get_seconds("bank.call-timeout", timeout),
        )

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
        futures = []
        for s in range(n):
            futures.append(
                client.submit(
                    BankShard,
                    [t.to_json() for t in specs],
                    s,
                    n,
                    buckets,
                    np.flatnonzero(owner == s).tolist(),
                    initial_capacity,
                    log_root,
                    log_sync,
                    actor=True,
                    workers=[addrs[s % len(addrs)]],
                    allow_other_workers=False,
                    key=f"{name}-shard-{s}",
                    pure=False,
                )
            )
        try:
            handles = [f.result(timeout=timeout) for f in futures]
        except TimeoutError as exc:
            raise DeadlineExceeded(f"bank {name!r}: shards did not start within {timeout:g} s") from exc
        logger.info("bank %s: %d shards on %s", name, n, sorted({addrs[s % len(addrs)] for s in range(n)}))
        cls._publish(client, name, handles, specs, owner, buckets, initial_capacity, log_root, log_sync)
        return cls(handles, specs, buckets=buckets, owner=owner, name=name, timeout=timeout,
                   futures=futures, log_root=log_root)

    @staticmethod
    def _publish(client: Any, name: str, handles: Sequence[Any], specs: Sequence[TableSpec], owner: np.ndarray,
                 buckets: int, initial_capacity: int, log_root: str | None, log_sync: bool) -> None:
        """Store the shard table for re-homing (see :mod:`carls_dask.bank.rehoming`)."""
        publish_table(client, name, handles, [t.to_json() for t in specs],
                      [np.flatnonzero(owner == s).tolist() for s in range(len(handles))],
                      buckets=buckets, initial_capacity=initial_capacity, log_root=log_root, log_sync=log_sync)
        if log_root is not None:
            install_walltime_plugin(client)

    # -- pickling -----------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_futures"] = []  # the creator keeps the actors alive; copies only call them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"<KnowledgeBank {self.name!r}: {self.n_shards} shards, tables {sorted(self._specs)}>"

    # -- properties ---------------------------------------------------------------------------------
    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self._shards)

    @property
    def tables(self) -> dict[str, TableSpec]:
        """The (resolved) table specs by name."""
        return dict(self._specs)

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
        owner = self._owner[bucket_of(keys, self.buckets)]
        if self.n_shards <= 8:  # a few boolean passes beat a sort
            routes = [(s, idx) for s in range(self.n_shards) if (idx := np.flatnonzero(owner == s)).size]
        else:
            order = np.argsort(owner, kind="stable")
            counts = np.bincount(owner, minlength=self.n_shards)
            parts = np.split(order, np.cumsum(counts)[:-1])
            routes = [(s, idx) for s, idx in enumerate(parts) if idx.size]
        if len(routes) == 1:
            return [(routes[0][0], everything)]
        return routes

    def _local_shard(self, s: int) -> Any:
        """The shard object itself when it lives in this process (a task on its worker), else None."""
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return None
        handle = self._shards[s]
        if getattr(handle, "_address", None) != worker.address:
            return None
        return worker.state.actors.get(handle.key)

    def _call(
        self, calls: Sequence[tuple[int, str, tuple[Any, ...], dict[str, Any]]], timeout: float | None = None
    ) -> list[Any]:
        """Issue every call, then wait for all of them (each within ``timeout``, default the call timeout).

        Shards living in the caller's process (a task co-located with its shard) are called directly,
        after the remote calls have been issued.
        """
        self._check_open()
        calls = with_op_ids(calls)
        local = {s: self._local_shard(s) for s in {c[0] for c in calls}}
        # with no co-located shard, the remote calls are sent together from the event loop when awaited;
        # otherwise they are sent now, so that they run while the co-located shards are called directly
        deferred = all(shard is None for shard in local.values())
        pending = [
            (s, None if local[s] is not None else self._issue(s, method, args, kwargs, deferred))
            for s, method, args, kwargs in calls
        ]
        direct = {
            i: self._direct(local[s], method, args, kwargs)
            for i, (s, method, args, kwargs) in enumerate(calls)
            if local[s] is not None
        }
        limit = self.timeout if timeout is None else timeout
        remote = [(i, s, fut) for i, (s, fut) in enumerate(pending) if fut is not None]
        answers: dict[int, Any] = dict(direct)
        if remote:
            answers.update(zip([i for i, _, _ in remote], self._wait(remote, limit), strict=True))
        if any(isinstance(a, _Failed) for a in answers.values()):
            self._recover(calls, answers, limit)
        return [answers[i] for i in range(len(calls))]

    @staticmethod
    def _direct(shard: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a co-located shard; one that was retired (its worker is closing) re-routes the call."""
        try:
            return getattr(shard, method)(*args, **kwargs)
        except ShardLostError as exc:
            return _Failed(exc)

    def _issue(
        self, s: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], deferred: bool = False
    ) -> Any:
        """Send one call to shard ``s`` (or, ``deferred``, prepare it to be sent when awaited); a handle
        whose actor is already known lost fails here."""
        try:
            handle = self._shards[s]
            if not deferred:
                return getattr(handle, method)(*args, **kwargs)
            future = handle._future
            if future is not None and future.status not in ("finished", "pending"):
                raise RuntimeError(f"Worker holding Actor was lost.  Status: {future.status}")
            if method == "lookup" and not args[3] and not kwargs:  # a read: on the worker's event loop
                method, args = "lookup_on_loop", args[:3]
            return _Deferred(handle, method, args, kwargs)
        except Exception as exc:
            return _Failed(exc)

    def _recover(self, calls: Sequence[tuple[int, str, tuple[Any, ...], dict[str, Any]]],
                 answers: dict[int, Any], limit: float) -> None:
        """Re-home the shards of failed calls whose worker is gone and retry those calls (same op ids).

        Waits at most ``carls.bank.rehome-timeout`` per shard; errors that do not mean a lost shard
        are raised as they are.
        """
        for i, answer in sorted(answers.items()):
            if not isinstance(answer, _Failed):
                continue
            s, method, args, kwargs = calls[i]
            exc = answer.exc
            deadline = time.monotonic() + self.rehome_timeout
            while True:
                if not is_lost(exc):
                    raise self._shard_error(s, exc, limit) from exc
                handle = adopt_or_rehome(self, s, exc, deadline)
                if handle is None:  # the shard's worker is alive: the error stands
                    raise self._shard_error(s, exc, limit) from exc
                try:
                    answers[i] = getattr(handle, method)(*args, **kwargs).result(
                        timeout=max(0.1, min(limit, deadline - time.monotonic())))
                    break
                except Exception as again:
                    if time.monotonic() >= deadline:
                        raise ShardLostError(
                            f"bank {self.name!r}: shard {s} was not back within carls.bank.rehome-timeout "
                            f"({self.rehome_timeout:g}s): {again!r}") from again
                    exc = again

    def _wait(self, remote: Sequence[tuple[int, int, Any]], limit: float) -> list[Any]:
        """Wait for all actor futures in one hop to the event loop; failures come back as ``_Failed``."""

        async def one(fut: Any) -> Any:
            return await fut

        async def all_of() -> list[Any]:
            tasks = [asyncio.ensure_future(fut._run() if isinstance(fut, _Deferred) else one(fut)) for _, _, fut in remote]
            return await watch_all(tasks, [self._shards[s] for _, s, _ in remote], limit)

        issued = [s for _, s, fut in remote if not isinstance(fut, _Failed)]
        if not issued:  # nothing reached a shard: no trip to the event loop
            return [fut for _, _, fut in remote]
        handle = self._shards[issued[0]]  # bound to this process's worker or client when the call was issued
        results = run_on_loop(handle, all_of)
        out = []
        for res in results:
            out.append(_Failed(res) if isinstance(res, BaseException) else res)
        return out

    def _shard_error(self, s: int, exc: BaseException, limit: float) -> BaseException:
        if isinstance(exc, TimeoutError | asyncio.TimeoutError):
            return DeadlineExceeded(f"bank {self.name!r}: shard {s} did not answer within {limit:g} s")
        if isinstance(exc, OSError) and "Unable to contact Actor" in str(exc):
            return ShardLostError(f"bank {self.name!r}: shard {s} cannot be reached ({exc})")
        if isinstance(exc, RuntimeError) and "Worker holding Actor was lost" in str(exc):
            return ShardLostError(f"bank {self.name!r}: shard {s} was lost with its worker")
        return exc

    def _keys(self, table: str, keys: Any) -> np.ndarray:
        check_batch_size(table, "keys", len(keys) if hasattr(keys, "__len__") and not isinstance(keys, str | bytes) else 1)
        k = to_int64_keys(keys, table)
        if k.size == 0:
            raise InvalidBatchError(f"table {table!r}: empty batch (0 keys); expected at least one key")
        return k

    # -- operations ---------------------------------------------------------------------------------
    def lookup(
        self,
        table: str,
        keys: Any,
        columns: Sequence[str] | None = None,
        insert: bool = False,
        max_staleness: float | None = None,
    ) -> LookupResult:
        """Read rows of ``keys`` in order (see :meth:`ShardCore.lookup`); missing keys are flagged in ``found``.

        With ``insert=True`` missing keys are allocated with the deterministic initializer and every
        occurrence of a key adds one to its frequency.
        """
        spec = self.spec(table)
        names = list(spec.column_names) if columns is None else [spec.column(c).name for c in columns]
        if max_staleness is not None and not (float(max_staleness) >= 0):
            raise InvalidBatchError(f"table {table!r}: max_staleness must be >= 0 seconds, got {max_staleness!r}")
        k = self._keys(table, keys)
        routes = self._route(k)
        parts = self._call([(s, "lookup", (table, k[idx], names, bool(insert)), {}) for s, idx in routes])
        if len(routes) == 1:
            return parts[0].result(max_staleness)
        return gather_rows([(idx, r) for (_, idx), r in zip(routes, parts, strict=True)], k.shape[0],
                           {c: spec.column(c) for c in names}, max_staleness)

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
        spec = self.spec(table)
        k = self._keys(table, keys)
        if not isinstance(values, Mapping) or not values:
            raise InvalidBatchError(
                f"table {table!r}: values must be a non-empty dict of column -> array, got {type(values).__name__}"
            )
        checked = {c: coerce_column_values(table, spec.column(c), v, k.shape[0]) for c, v in values.items()}
        if isinstance(model_step, bool) or not isinstance(model_step, int | np.integer):
            raise InvalidDTypeError(f"table {table!r}: model_step must be an int, got {model_step!r}")
        if not isinstance(maker, str):
            raise InvalidDTypeError(f"table {table!r}: maker must be a str, got {type(maker).__name__}")
        routes = self._route(k)
        out = self._call(
            [
                (s, "update", (table, k[idx], {c: v[idx] for c, v in checked.items()}, int(model_step), maker), {})
                for s, idx in routes
            ]
        )
        return int(sum(out))

    def apply_gradients(
        self,
        table: str,
        keys: Any,
        grads: Mapping[str, Any] | np.ndarray,
        column: str = "embedding",
        learning_rate: float | None = None,
    ) -> np.ndarray:
        """Apply the table's optimizer on the shards (duplicate keys' gradients are summed).

        Returns ``bool[n]``: which keys were present and updated (absent keys are skipped, as in CARLS).
        """
        spec = self.spec(table)
        if spec.optimizer is None:
            raise InvalidBatchError(f"table {table!r} has no optimizer; create it with optimizer='sgd', 'adagrad' or 'adam'")
        k = self._keys(table, keys)
        g = grads if isinstance(grads, Mapping) else {column: grads}
        if not g:
            raise InvalidBatchError(f"table {table!r}: gradients must be a non-empty dict of column -> array")
        checked: dict[str, np.ndarray] = {}
        for c, v in g.items():
            col = spec.column(c)
            if not col.is_float:
                raise InvalidDTypeError(
                    f"table {table!r}, column {c!r}: gradients need a float column, but it is {col.dtype}"
                )
            checked[c] = coerce_column_values(table, col, v, k.shape[0], what="gradients", dtype=compute_dtype(col.np_dtype))
        if learning_rate is not None and not (float(learning_rate) > 0 and np.isfinite(float(learning_rate))):
            raise InvalidBatchError(f"table {table!r}: learning_rate must be a finite number > 0, got {learning_rate!r}")
        routes = self._route(k)
        parts = self._call(
            [
                (s, "apply_gradients", (table, k[idx], {c: v[idx] for c, v in checked.items()}, column, learning_rate), {})
                for s, idx in routes
            ]
        )
        found = np.empty(k.shape[0], dtype=bool)
        for (_, idx), f in zip(routes, parts, strict=True):
            found[idx] = f
        return found

    def delete(self, table: str, keys: Any) -> np.ndarray:
        """Remove keys; returns ``bool[n]``, True where the key was present."""
        self.spec(table)
        k = self._keys(table, keys)
        routes = self._route(k)
        parts = self._call([(s, "delete", (table, k[idx]), {}) for s, idx in routes])
        out = np.empty(k.shape[0], dtype=bool)
        for (_, idx), p in zip(routes, parts, strict=True):
            out[idx] = p
        return out

    def contains(self, table: str, keys: Any) -> np.ndarray:
        """``bool[n]``: whether each key is present (frequency untouched)."""
        self.spec(table)
        k = self._keys(table, keys)
        routes = self._route(k)
        parts = self._call([(s, "contains", (table, k[idx]), {}) for s, idx in routes])
        out = np.empty(k.shape[0], dtype=bool)
        for (_, idx), p in zip(routes, parts, strict=True):
            out[idx] = p
        return out

    def size(self, table: str | None = None) -> int:
        """Rows in ``table`` (or in all tables) over all shards."""
        if table is not None:
            self.spec(table)
        return int(sum(self._call([(s, "size", (table,), {}) for s in range(self.n_shards)])))

    def keys(self, table: str) -> np.ndarray:
        """All keys of ``table`` (shard by shard)."""
        self.spec(table)
        parts = self._call([(s, "keys", (table,), {}) for s in range(self.n_shards)])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def sample_negatives(
        self,
        table: str,
        n: int,
        sampler: str = "uniform",
        unique: bool = True,
        true_keys: Any = None,
        seed: int | None = None,
    ) -> NegativeSample:
        """Sample ``n`` candidate keys of ``table`` with expected counts (logQ correction).

        ``log_uniform`` ranks all keys of the bank by frequency. The client gathers every shard's keys
        and frequencies (one call per shard), so the cost grows with the table: meant for class or
        vocabulary tables, not for tables of many millions of rows.
        """
        self.spec(table)
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise InvalidDTypeError(f"table {table!r}: sample size must be an int, got {n!r}")
        check_batch_size(table, "samples", int(n))
        parts = self._call([(s, "keys_and_frequency", (table,), {}) for s in range(self.n_shards)])
        keys = np.concatenate([p[0] for p in parts])
        freq = np.concatenate([p[1] for p in parts])
        tk = None if true_keys is None else to_int64_keys(true_keys, table)
        return sample_candidates(
            table, order_by_frequency(keys, freq), int(n), sampler=sampler, unique=unique,
            true_keys=tk, rng=np.random.default_rng(seed),
        )

    def top_k(
        self, table: str, query: Any, k: int, column: str = "embedding", metric: str = "dot"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k keys by dot product or cosine, merged across shards: ``(keys[q, k], scores[q, k])``.

        Raises
        ------
        InvalidBatchError
            If the table holds fewer than ``k`` usable rows (CARLS needs exactly ``k`` results).
        """
        spec = self.spec(table)
        col = spec.column(column)
        q = np.asarray(query)
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2 or len(col.shape) != 1 or q.shape[1] != col.shape[0] or q.shape[0] == 0:
            raise InvalidShapeError(
                f"table {table!r}, column {column!r}: query has shape {np.asarray(query).shape}; expected (q>0, {col.shape})"
            )
        if isinstance(k, int | np.integer) and not isinstance(k, bool):
            check_batch_size(table, "top-k results (queries x k)", q.shape[0] * int(k))
        parts = self._call([(s, "top_k", (table, q, int(k), column, metric), {}) for s in range(self.n_shards)])
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
        per = self._call([(s, "stats", (), {}) for s in range(self.n_shards)])
        totals: dict[str, dict[str, int]] = {}
        for st in per:
            for t, info in st["tables"].items():
                tot = totals.setdefault(t, {"rows": 0, "bytes_allocated": 0, "bytes_used": 0})
                for f in tot:
                    tot[f] += int(info[f])
        return {"name": self.name, "n_shards": self.n_shards, "buckets": self.buckets, "shards": per, "tables": totals,
                "rehoming": rehome_stats(self)}

    def set_step(self, step: int) -> None:
        """Tell every shard the current training step (recorded with delta-log records)."""
        self._call([(s, "set_step", (int(step),), {}) for s in range(self.n_shards)])

    # -- persistence --------------------------------------------------------------------------------
    def export_state(self) -> list[dict[str, Any]]:
        """Every shard's whole state, as :meth:`ShardCore.export_state <carls_dask.bank.core.ShardCore.export_state>`
        returns it, in shard order.

        Each entry holds ``meta`` (its ``makers`` list names the codes of its ``prov/maker`` arrays) and
        ``tables``: per table, row-aligned copies of ``keys``, ``bucket``, ``frequency``, ``prov/*``,
        ``col/*`` and ``slot/<column>/<slot>``. Rows come in each shard's storage order. Everything
        is copied to the client, so this is meant for tests, checks and small banks.
        """
        return list(self._call([(s, "export_state", (), {}) for s in range(self.n_shards)]))

    def snapshot(self, root: str, step: int, *, timeout: float | None = None, **snapshot_kwargs: Any) -> int:
        """Write a committed snapshot of every shard under ``root``; returns its version.

        Each shard writes its own arrays (concurrently); the snapshot is committed only when all
        have written, so a failure leaves the previous snapshot the newest valid one. ``timeout``
        bounds each shard's write (default: ten times the call timeout). All optimizer state is kept
        per row (the slots, Adam's per-row ``step`` among them), so the rows are the whole state.
        """
        from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot

        kwargs = {
            "chunk_rows": int(config.get("storage.chunk-rows")),
            "compressor": config.get("storage.compressor"),
            **snapshot_kwargs,
        }
        handle = begin_snapshot(root, int(step), **kwargs)
        self._call([(s, "set_step", (int(step),), {}) for s in range(self.n_shards)])
        self._call([(s, "snapshot", (handle,), {}) for s in range(self.n_shards)],
                   timeout=10 * self.timeout if timeout is None else timeout)
        entry = commit_snapshot(
            handle,
            {
                "name": self.name,
                "n_shards": self.n_shards,
                "buckets": self.buckets,
                "tables": {t: s.to_json() for t, s in self._specs.items()},
            },
        )
        return int(entry["version"])

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
        """Start a bank from snapshot ``version`` (newest by default) of ``root``, on any shard count.

        Each new shard reads the rows of the buckets it owns from the snapshot and then replays the
        delta log recorded after it (``replay_log``). Optimizer slots and provenance come back exactly.
        """
        from carls_dask.storage.snapshots import read_manifest

        man = read_manifest(root, version)
        meta = man.get("meta", {})
        specs = [TableSpec.from_json(t) for t in meta["tables"].values()]
        buckets = int(man["buckets"])
        n = int(n_shards if n_shards is not None else man["n_shards"])
        if n < 1 or n > buckets:
            raise InvalidBatchError(f"restore of {root}: n_shards={n}; expected 1 <= n_shards <= {buckets}")
        t = config.get_seconds("bank.call-timeout", timeout)
        bank = cls._start(
            client, specs, _owner_map(buckets, n), buckets, workers,
            name or str(meta.get("name", f"bank-{uuid.uuid4().hex[:8]}")) + f"-r{uuid.uuid4().hex[:4]}",
            log_root=log_root, log_sync=log_sync,
            initial_capacity=int(config.get("bank.initial-capacity")), timeout=t,
        )
        try:
            done = bank._call([(s, "restore", (str(root), int(man["version"]), replay_log), {}) for s in range(n)],
                              timeout=10 * t)
        except BaseException:
            bank.close()
            raise
        if log_root is not None and str(log_root) != str(root):
            set_base(client, bank.name, str(root), int(man["version"]))
        logger.info("bank %s restored from v%d of %s: %s", bank.name, man["version"], root, done)
        return bank

    def close(self) -> None:
        """Release the shards (their delta logs are closed first). Idempotent."""
        if self._closed:
            return
        try:
            if self._futures:
                self._call([(s, "close", (), {}) for s in range(self.n_shards)])
        finally:
            self._closed = True
            if self._futures:
                forget_table(self)
            for f in self._futures:
                f.release()
            self._futures = []

    def __enter__(self) -> KnowledgeBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- awaitable forms ----------------------------------------------------------------------------
    async def lookup_async(self, *args: Any, **kwargs: Any) -> LookupResult:
        """Awaitable :meth:`lookup` (runs the fan-out off the event loop)."""
        return await asyncio.to_thread(self.lookup, *args, **kwargs)

    async def update_async(self, *args: Any, **kwargs: Any) -> int:
        """Awaitable :meth:`update`."""
        return await asyncio.to_thread(self.update, *args, **kwargs)

    async def apply_gradients_async(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Awaitable :meth:`apply_gradients`."""
        return await asyncio.to_thread(self.apply_gradients, *args, **kwargs)

    async def delete_async(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Awaitable :meth:`delete`."""
        return await asyncio.to_thread(self.delete, *args, **kwargs)

    async def contains_async(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Awaitable :meth:`contains`."""
        return await asyncio.to_thread(self.contains, *args, **kwargs)

    async def size_async(self, table: str | None = None) -> int:
        """Awaitable :meth:`size`."""
        return await asyncio.to_thread(self.size, table)

    async def keys_async(self, table: str) -> np.ndarray:
        """Awaitable :meth:`keys`."""
        return await asyncio.to_thread(self.keys, table)

    async def sample_negatives_async(self, *args: Any, **kwargs: Any) -> NegativeSample:
        """Awaitable :meth:`sample_negatives`."""
        return await asyncio.to_thread(self.sample_negatives, *args, **kwargs)

    async def top_k_async(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Awaitable :meth:`top_k`."""
        return await asyncio.to_thread(self.top_k, *args, **kwargs)

    async def stats_async(self) -> dict[str, Any]:
        """Awaitable :meth:`stats`."""
        return await asyncio.to_thread(self.stats)

