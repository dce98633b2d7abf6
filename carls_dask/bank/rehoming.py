"""Re-homing of bank shards whose worker went away (killed, lost, or closing at its walltime).

The bank's current shard table lives in the scheduler, in a named :class:`distributed.Variable`
(``carls-bank-<name>``): per shard the actor's key, its worker and a generation number, plus what
is needed to start a shard again (table specs, buckets, the store folder). Every pickled copy of a
:class:`~carls_dask.bank.client.KnowledgeBank` (the creator's, and each one inside a trainer or
maker task) holds its own actor handles. When a call fails because the shard's worker is gone,
that copy:

1. takes the bank's named :class:`distributed.Lock` (within ``carls.bank.rehome-timeout``);
2. re-reads the table: if another copy already re-homed the shard, it adopts the new actor (in its
   own :class:`~carls_dask.bank.actor_internals.ShardTable`);
3. otherwise it starts a new :class:`~carls_dask.bank.actor.BankShard` actor on a live worker,
   which rebuilds itself from the bank store (newest snapshot plus the delta log after it), keeps
   the actor alive through a per-shard Variable that holds its future, and publishes the new table;
4. retries the failed call on the new actor with the same operation id.

Guarantees: every acknowledged write is in the shard's delta log before the call returns, so the
new shard holds it. A mutating batch carries an operation id that the shard logs with its rows; a
batch that was logged but whose answer was lost with the old process is recognised on the retry and
not applied twice (``apply_gradients`` is not re-applied, ``lookup(insert=True)`` does not count the
keys again). A batch that never reached the log is simply applied on the retry. Batches of a
co-located task die with the task.

Every contact with the actors themselves (starting one, building a handle, asking whether one is
alive, the actors living on a worker) goes through :mod:`carls_dask.bank.actor_internals`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from carls_dask import config
from carls_dask.bank.actor_internals import (
    ShardTable,
    actor_alive,
    actor_handle,
    send_call,
    start_shard,
    worker_actors,
    worker_client,
)
from carls_dask.errors import DeadlineExceeded, LifecycleError, ShardLostError

__all__ = [
    "WalltimePlugin",
    "adopt_or_rehome",
    "forget_table",
    "install_walltime_plugin",
    "process_id",
    "publish_table",
    "read_table",
    "rehome_line",
    "rehome_stats",
    "rehome_topic",
    "retire_worker_shards",
    "set_base",
]

logger = logging.getLogger(__name__)

_EVENTS_KEPT = 20


def table_name(bank_name: str) -> str:
    """Name of the Variable holding the bank's shard table."""
    return f"carls-bank-{bank_name}"


def _lock_name(bank_name: str) -> str:
    return f"carls-bank-{bank_name}-rehome"


def _holder_name(bank_name: str, shard: int) -> str:
    return f"carls-bank-{bank_name}-shard-{shard}"


def publish_table(
    client: Any,
    shards: ShardTable,
    tables: Sequence[Mapping[str, Any]],
    owned: Sequence[Sequence[int]],
    *,
    buckets: int,
    initial_capacity: int,
    log_root: str | None,
    log_sync: bool,
    shard_settings: Mapping[str, Any] | None = None,
    base: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Store a new bank's shard table (generation 0) in the scheduler; returns it."""
    from distributed import Variable

    table = {
        "name": shards.name,
        "keys": shards.keys,
        "addresses": shards.addresses,
        "generation": list(shards.generations),
        "tables": [dict(t) for t in tables],
        "owned": [[int(b) for b in o] for o in owned],
        "buckets": int(buckets),
        "initial_capacity": int(initial_capacity),
        "log_root": None if log_root is None else str(log_root),
        "log_sync": bool(log_sync),
        "shard_settings": dict(shard_settings or {}),
        "base": None if base is None else [str(base[0]), int(base[1])],
        "rehomed": 0,
        "events": [],
    }
    Variable(table_name(shards.name), client=client).set(table)
    return table


def read_table(client: Any, name: str, timeout: float = 10.0) -> dict[str, Any]:
    """The bank's current shard table.

    Raises
    ------
    LifecycleError
        If the scheduler holds no table for the bank (closed, or created on another scheduler).
    """
    from distributed import Variable

    try:
        stored = Variable(table_name(name), client=client).get(timeout=timeout)
    except TimeoutError as exc:
        raise LifecycleError(f"bank {name!r}: the scheduler holds no shard table "
                             f"(Variable {table_name(name)!r}); expected one set by KnowledgeBank.create") from exc
    table: dict[str, Any] = dict(stored)
    for field in ("keys", "addresses", "generation", "events"):  # msgpack gives tuples back
        table[field] = list(table[field])
    return table


def set_base(client: Any, name: str, root: str, version: int) -> None:
    """Record the snapshot a restored bank started from (used when its store has no snapshot yet)."""
    from distributed import Variable

    table = read_table(client, name)
    table["base"] = [str(root), int(version)]
    Variable(table_name(name), client=client).set(table)


def forget_table(shards: ShardTable) -> None:
    """Delete the bank's table and the holders of re-homed shards (at close)."""
    from distributed import Variable

    try:
        client = shards.dask_client()
        table = read_table(client, shards.name, timeout=2.0)
        for s, gen in enumerate(table["generation"]):
            if gen:
                Variable(_holder_name(shards.name, s), client=client).delete()
        Variable(table_name(shards.name), client=client).delete()
    except Exception:  # closing: nothing to report the failure to but the log
        logger.debug("bank %s: could not delete its shard table", shards.name, exc_info=True)


def rehome_stats(shards: ShardTable) -> dict[str, Any]:
    """Re-homings of the bank so far: ``count``, ``generation`` per shard and the newest ``events``."""
    try:
        table = read_table(shards.dask_client(), shards.name, timeout=2.0)
    except LifecycleError:
        return {"count": 0, "generation": [0] * len(shards), "events": []}
    return {"count": int(table["rehomed"]), "generation": list(table["generation"]), "events": list(table["events"])}


def _live_workers(client: Any, exclude: Sequence[str]) -> list[str]:
    info = client.scheduler_info(n_workers=-1).get("workers", {})
    return sorted(a for a, w in info.items() if a not in exclude and w.get("status", "running") == "running")


def adopt_or_rehome(shards: ShardTable, s: int, failed: BaseException | None, deadline: float, *, limit: float,
                    exclude: Sequence[str] = (), reason: str | None = None) -> Any:
    """Make shard ``s`` of ``shards`` a live actor again; returns its handle.

    Another copy's re-homing is adopted; otherwise a new shard is started and restored (see the
    module notes). ``deadline`` is a :func:`time.monotonic` time; ``limit`` the configured
    ``carls.bank.rehome-timeout`` (for messages). Returns None when ``failed`` did not come from a
    lost shard (its actor is still held by a live worker).

    Raises
    ------
    ShardLostError
        If the bank has no store to re-home from, or no live worker took the shard in time.
    """
    from distributed import Lock

    from carls_dask.bank.actor import BankShard

    client = shards.dask_client()
    old_key = shards.keys[s]
    left = deadline - time.monotonic()
    lock = Lock(_lock_name(shards.name))
    if not lock.acquire(timeout=max(0.1, left)):
        raise ShardLostError(f"bank {shards.name!r}: shard {s} is being re-homed by another client and was not back "
                             f"within carls.bank.rehome-timeout ({limit:g}s)")
    try:
        table = read_table(client, shards.name)
        if table["keys"][s] != old_key:  # another copy re-homed it already
            handle = actor_handle(BankShard, table["keys"][s], table["addresses"][s])
            shards.replace(s, handle, int(table["generation"][s]))
            logger.info("bank %s: shard %d adopted at %s (generation %d)", shards.name, s, table["addresses"][s],
                        table["generation"][s])
            return handle
        if failed is not None and not isinstance(failed, ShardLostError) and actor_alive(client, old_key):
            return None  # the worker is alive: not a lost shard
        return _rehome(shards, client, table, s, deadline, limit=limit, exclude=exclude,
                       reason=reason or (repr(failed) if failed is not None else "lost"))
    finally:
        lock.release()


def _rehome(shards: ShardTable, client: Any, table: dict[str, Any], s: int, deadline: float,
            *, limit: float, exclude: Sequence[str], reason: str) -> Any:
    from distributed import Variable

    from carls_dask.bank.actor import BankShard

    name = shards.name
    root = table["log_root"]
    if root is None:
        raise ShardLostError(f"bank {name!r}: shard {s} was lost ({reason}) and cannot be re-homed: the bank has no "
                             "store to restore it from; create it with log_root=... (KnowledgeBank.create)")
    t0 = time.monotonic()
    dead = table["addresses"][s]
    logger.info("bank %s: shard %d on %s lost (%s); re-homing from %s", name, s, dead, reason, root)
    workers: list[str] = []
    while not workers:
        workers = _live_workers(client, [dead, *exclude])
        if workers:
            break
        if time.monotonic() >= deadline:
            raise ShardLostError(f"bank {name!r}: shard {s} lost and no live worker joined within "
                                 f"carls.bank.rehome-timeout ({limit:g}s)")
        time.sleep(0.2)
    load = {w: sum(a == w for i, a in enumerate(table["addresses"]) if i != s) for w in workers}
    target = min(workers, key=lambda w: (load[w], w))
    gen = int(table["generation"][s]) + 1
    args = (table["tables"], s, len(table["keys"]), table["buckets"], table["owned"][s],
            table["initial_capacity"], root, table["log_sync"], dict(table.get("shard_settings") or {}))
    fut = start_shard(client, BankShard, args, target, f"{name}-shard-{s}-g{gen}")
    try:
        handle = fut.result(timeout=max(0.1, deadline - time.monotonic()))
        base = tuple(table["base"]) if table["base"] else None
        info = send_call(handle, "rehome_restore", (root, base), {}).result(
            timeout=max(0.1, deadline - time.monotonic()))
    except TimeoutError as exc:
        fut.release()
        raise DeadlineExceeded(f"bank {name!r}: re-homed shard {s} was not restored on {target} within "
                               f"carls.bank.rehome-timeout ({limit:g}s)") from exc
    except BaseException:
        fut.release()
        raise
    Variable(_holder_name(name, s), client=client).set(fut)  # keeps the new actor alive for every copy
    fut.release()
    pause = time.monotonic() - t0
    table["keys"][s] = str(handle.key)
    table["addresses"][s] = target
    table["generation"][s] = gen
    table["rehomed"] = int(table["rehomed"]) + 1
    rolled = {str(t): int(step) for t, step in dict(info.get("rolled_back") or {}).items()}
    event = {"shard": s, "generation": gen, "from": dead, "to": target, "reason": reason[:200],
             "rows": int(info["rows"]), "records": int(info["records"]), "version": int(info["version"]),
             "restore_s": float(info["seconds"]), "rehome_s": pause, "time": time.time(), "rolled_back": rolled,
             "by": process_id()}
    table["events"] = [*table["events"], event][-_EVENTS_KEPT:]
    Variable(table_name(name), client=client).set(table)
    shards.replace(s, handle, gen)
    logger.warning("%s", rehome_line(name, event))
    try:  # a Workbench driving the bank logs the line too, when a task's copy re-homed (its log stays on the worker)
        client.log_event(rehome_topic(name), event)
    except Exception:  # the line above is the record; the topic only relays it
        logger.debug("bank %s: could not relay the re-homing of shard %d", name, s, exc_info=True)
    return handle


def rehome_topic(bank_name: str) -> str:
    """The event topic on which the bank's re-homings are relayed (the events of :func:`rehome_stats`)."""
    return f"carls-bank-{bank_name}-rehomed"


def process_id() -> str:
    """``host:pid`` of this process (a re-homing event names the process that re-homed)."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def rehome_line(bank: str, event: Mapping[str, Any]) -> str:
    """One line for a re-homing event: what was lost, what took over, how long it took."""
    source = f"snapshot v{event['version']}" if int(event["version"]) >= 0 else "no snapshot"
    line = (f"bank {bank}: shard {event['shard']} lost with worker {event['from']}; re-homed on {event['to']} from "
            f"{source} + {event['records']} log records ({event['rows']} rows) in {float(event['rehome_s']):.2f}s")
    rolled = event.get("rolled_back") or {}
    if rolled:
        steps = sorted(set(rolled.values()))
        line += (f"; tables {sorted(rolled)} (durability snapshot) back at step {steps[0] if len(steps) == 1 else steps}"
                 ", awaiting the rollback of their writers")
    return line


def retire_worker_shards(worker: Any, reason: str, timeout: float | None = None) -> list[dict[str, Any]]:
    """Re-home every bank shard living on ``worker`` before it closes (walltime, scale-down).

    Each shard stops serving and closes its delta log (every acknowledged batch is in it), then a
    new shard restored from the store takes its place on another worker. Runs in a thread of the
    closing worker (not its event loop). Returns the re-homing events.
    """
    from carls_dask.bank.actor import BankShard

    limit = config.get_seconds("bank.rehome-timeout", timeout)
    client = worker_client(worker)
    out = []
    for key, obj in worker_actors(worker).items():
        if not isinstance(obj, BankShard):
            continue
        name = _bank_of(str(key))
        if name is None:
            continue
        try:
            table = read_table(client, name, timeout=2.0)
        except LifecycleError:
            continue  # the bank was closed: nothing to keep
        obj.retire(reason)
        shards = ShardTable.from_keys(name, BankShard, table["keys"], table["addresses"], table["generation"],
                                      client=client)
        s = obj.core.shard  # this worker's actor, which may be older than the table's (then it is adopted)
        shards.replace(s, actor_handle(BankShard, str(key), worker.address), shards.generations[s])
        adopt_or_rehome(shards, s, None, time.monotonic() + limit, limit=limit,
                        exclude=[worker.address], reason=reason)
        out.append(rehome_stats(shards)["events"][-1])
    return out


class WalltimePlugin(WorkerPlugin):
    """Worker plugin: a worker with a ``lifetime`` (dask-jobqueue's ``--lifetime``, or
    ``distributed.worker.lifetime.duration``) re-homes its bank shards ``carls.bank.walltime-margin``
    before that lifetime ends, while it still serves; the graceful close then loses nothing.

    Dask cannot move actors when it retires a worker, so without this the shards would be lost with
    the worker. The lifetime is counted from the worker process's start (a little early at worst).
    """

    name = "carls-bank-walltime"

    def __init__(self, margin: float | str | None = None) -> None:
        self.margin = config.get_seconds("bank.walltime-margin", margin)
        self.limit = config.get_seconds("bank.rehome-timeout")
        self._timer: Any = None
        self._task: Any = None

    def setup(self, worker: Any) -> None:
        """Schedule the re-homing when the worker has a lifetime."""
        import psutil

        lifetime = getattr(worker, "lifetime", None)
        if not lifetime:
            return
        left = psutil.Process().create_time() + float(lifetime) - self.margin - time.time()
        import asyncio

        self._timer = asyncio.get_running_loop().call_later(max(0.0, left), self._fire, worker)
        logger.info("worker %s: bank shards re-homed in %.1fs (lifetime %.1fs, margin %.1fs)",
                    worker.address, max(0.0, left), lifetime, self.margin)

    def _fire(self, worker: Any) -> None:
        import asyncio

        async def run() -> None:
            try:
                events = await asyncio.to_thread(retire_worker_shards, worker, "worker lifetime ends", self.limit)
            except Exception:
                logger.exception("worker %s: re-homing its bank shards before its lifetime ends failed",
                                 worker.address)
            else:
                if events:
                    logger.warning("worker %s: re-homed %d bank shard(s) before its lifetime ends",
                                   worker.address, len(events))

        self._task = asyncio.get_running_loop().create_task(run())

    def teardown(self, worker: Any) -> None:
        """Cancel the timer."""
        if self._timer is not None:
            self._timer.cancel()


def install_walltime_plugin(client: Any) -> None:
    """Register :class:`WalltimePlugin` on every current and future worker (idempotent)."""
    client.register_plugin(WalltimePlugin(), name=WalltimePlugin.name)


def _bank_of(key: str) -> str | None:
    """The bank name in a shard actor's key (``<bank>-shard-<s>`` or ``<bank>-shard-<s>-g<gen>``)."""
    head, sep, _ = key.rpartition("-shard-")
    return head if sep else None
