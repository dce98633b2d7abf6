"""How calls reach the bank's shards: the one module that touches distributed's actor machinery.

A call to a shard is a value, :class:`ShardCall`, built by the client method that knows what it is
(a read, a mutating batch with an operation id, a read the shard may serve on its event loop). A
transport sends a batch of such calls and returns the answers in order:

* :class:`LocalTransport`: the shards are :class:`~carls_dask.bank.actor.BankShard` objects held in
  this process and called directly (``KnowledgeBank.local``; no cluster).
* :class:`DaskTransport`: one Dask actor per shard (``KnowledgeBank.create``). Its fast paths: a
  shard living in the caller's process (a task on the shard's worker) is called directly; remote
  calls of a batch are sent together in one hop to the event loop (``actor_execute`` requests sent
  from the loop); read-only lookups run on the shard worker's event loop (``loop_method``); one
  watchdog waits for all of them; failed calls of a lost shard are re-homed
  (:mod:`carls_dask.bank.rehoming`) and retried with the same operation id.

Written against ``distributed`` 2026.8.0 (``dask`` 2026.8.0). Besides the public API
(``Client.submit(..., actor=True)``, actor method calls and their ``.result()``, ``Client.who_has``,
``get_worker``/``get_client``), it relies on these internals, each checked by a named test in
``tests/bank/test_transport_assumptions.py``:

* ``Actor._address``: the address of the worker holding the actor (:func:`handle_address`);
* ``Actor._future``: the actor task's future on a client, ``None`` on other copies, whose status
  leaves ``"finished"``/``"pending"`` when the actor is lost (:func:`handle_lost`);
* ``Actor._worker_rpc.actor_execute(function=, actor=, args=, kwargs=)`` with serialisable
  arguments answers ``{"status": "OK", "result": ...}`` or ``{"status": "error", "exception": ...}``,
  and awaits a coroutine method on the worker's event loop (:func:`execute`);
* ``Actor._scheduler_rpc.who_has(keys=[...])`` answers ``{key: [addresses]}`` (:func:`scheduler_holds`);
* ``vars(actor)["_client"]``/``vars(actor)["_worker"]``: what the handle is bound to, and
  ``distributed.utils.sync(worker.loop, fn)`` to run on a worker's loop (:func:`run_on_loop`);
* ``Actor(cls, address, key)`` builds a handle from a key and an address (:func:`actor_handle`);
* ``Worker.state.actors[key]`` holds the actor object itself (:func:`worker_actors`, co-located calls);
* ``Worker._get_client()``: a client of the worker's scheduler from a worker thread (:func:`worker_client`);
* the error texts ``"Worker holding Actor was lost"`` and ``"Unable to contact Actor's worker"`` of a
  lost actor (:func:`shard_error`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from carls_dask.bank import stages
from carls_dask.errors import CarlsError, DeadlineExceeded, ShardLostError

__all__ = [
    "DaskTransport",
    "Failed",
    "LocalTransport",
    "ShardCall",
    "ShardTable",
    "actor_alive",
    "actor_handle",
    "execute",
    "handle_address",
    "handle_lost",
    "is_lost",
    "new_op_id",
    "run_on_loop",
    "scheduler_holds",
    "stamp_op_ids",
    "start_shard",
    "watch_all",
    "worker_actors",
    "worker_client",
]

logger = logging.getLogger(__name__)

#: The error text distributed gives a call to a handle whose actor future failed.
_LOST_TEXT = "Worker holding Actor was lost"
#: The error text distributed gives a call whose connection to the actor's worker broke.
_UNREACHABLE_TEXT = "Unable to contact Actor's worker"
_WATCH_INTERVAL = 0.5  # seconds between checks of a waited-on shard's actor future


# -- calls ------------------------------------------------------------------------------------------
def new_op_id() -> int:
    """A random positive 63-bit operation id."""
    return int.from_bytes(os.urandom(8), "little") >> 1


@dataclasses.dataclass(frozen=True, eq=False)
class ShardCall:
    """One call to one shard: ``shards[shard].<method>(*args, **kwargs)``.

    Parameters
    ----------
    shard
        Shard id.
    method
        Name of the :class:`~carls_dask.bank.actor.BankShard` method.
    args, kwargs
        Its arguments.
    mutating
        Whether the call changes the shard's state; such a call carries the batch's operation id
        (the method takes ``op_id``), so that a batch retried after a re-home is applied once.
    loop_method
        Name of a coroutine method of the shard taking the same arguments that serves this
        (read-only) call on the worker's event loop when the shard is remote; ``None`` for none.
    op_id
        The operation id of a mutating call (set by :func:`stamp_op_ids` when None).
    """

    shard: int
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    mutating: bool = False
    loop_method: str | None = None
    op_id: int | None = None

    def __post_init__(self) -> None:
        if self.mutating and self.loop_method is not None:
            raise ValueError(f"ShardCall {self.method!r} to shard {self.shard}: a mutating call cannot be served "
                             f"read-only on the event loop (loop_method={self.loop_method!r}); expected None")
        if self.op_id is not None and not self.mutating:
            raise ValueError(f"ShardCall {self.method!r} to shard {self.shard}: op_id={self.op_id} on a call that "
                             "is not mutating; expected op_id=None")

    @property
    def send_kwargs(self) -> dict[str, Any]:
        """The keyword arguments sent, the operation id included."""
        if self.op_id is None:
            return dict(self.kwargs)
        return {**self.kwargs, "op_id": self.op_id}


def stamp_op_ids(calls: Sequence[ShardCall]) -> list[ShardCall]:
    """The calls with an operation id on every mutating one (one new id per batch, shared by its shards)."""
    op: int | None = None
    out = []
    for c in calls:
        if c.mutating and c.op_id is None:
            if op is None:
                op = new_op_id()
            c = dataclasses.replace(c, op_id=op)
        out.append(c)
    return out


class Failed:
    """The error of a shard call, kept apart so that the other shards' answers are not lost."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __await__(self) -> Any:  # awaiting a call that could not even be issued raises its error
        raise self.exc


# -- the local transport ----------------------------------------------------------------------------
class LocalTransport:
    """Shards held in this process (:class:`~carls_dask.bank.actor.BankShard` objects), called directly.

    Errors raised by a shard are raised as they are. The transport cannot be pickled (the shards
    hold locks and open delta logs): pass a bank created with ``KnowledgeBank.create`` to tasks.
    """

    kind = "local"
    #: In-process shards are never re-homed.
    rehome_timeout = 0.0

    def __init__(self, shards: Sequence[Any]) -> None:
        self.shards = list(shards)

    @property
    def owns_shards(self) -> bool:
        """Whether the bank holding this transport closes the shards (always: they live here)."""
        return bool(self.shards)

    def __reduce__(self) -> Any:
        raise TypeError(f"a bank of {len(self.shards)} in-process shards (KnowledgeBank.local) cannot be pickled; "
                        "expected a bank created with KnowledgeBank.create to pass into tasks")

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.shards)

    def call(self, calls: Sequence[ShardCall], timeout: float) -> list[Any]:
        """Call each shard in turn; returns the answers in the order of ``calls`` (``timeout`` does not apply:
        the calls run in this thread)."""
        stages.mark("client", "issuing calls")
        return [getattr(self.shards[c.shard], c.method)(*c.args, **c.send_kwargs) for c in calls]

    def local_shard(self, s: int) -> Any:
        """The shard object ``s`` (always in this process)."""
        return self.shards[s]

    def rehoming(self) -> dict[str, Any]:
        """In-process shards are never re-homed."""
        return {"count": 0, "generation": [0] * self.n_shards, "events": []}

    def release(self) -> None:
        """Drop the shards (after their ``close``)."""
        self.shards = []


# -- distributed internals --------------------------------------------------------------------------
def handle_address(handle: Any) -> str:
    """Address of the worker holding the actor of ``handle``."""
    return str(handle._address)


def handle_lost(handle: Any) -> bool:
    """Whether the actor future this handle holds (a client's handle) says the actor is gone."""
    future = getattr(handle, "_future", None)
    return future is not None and future.status not in ("finished", "pending")


def handle_client(handle: Any) -> Any:
    """The :class:`distributed.Client` the handle is bound to, or None."""
    return vars(handle).get("_client")


def actor_handle(cls: type, key: str, address: str) -> Any:
    """A handle to the actor ``key`` of class ``cls`` on the worker at ``address``."""
    from distributed.actor import Actor

    return Actor(cls, address, key)


def worker_client(worker: Any) -> Any:
    """A client of ``worker``'s scheduler, usable from a thread of that worker."""
    return worker._get_client()


def worker_actors(worker: Any) -> dict[str, Any]:
    """The actor objects living on ``worker`` by key (a copy)."""
    return dict(worker.state.actors)


def actor_alive(client: Any, key: str) -> bool:
    """Whether the scheduler knows a worker holding the actor ``key``."""
    who = client.who_has([key])
    return bool(who.get(key))


async def scheduler_holds(handle: Any) -> bool:
    """On the event loop: whether the scheduler still knows a worker holding the actor of ``handle``."""
    who = await handle._scheduler_rpc.who_has(keys=[handle.key])
    return bool(who.get(handle.key))


async def execute(handle: Any, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """On the event loop: run ``method`` of the actor of ``handle`` with one ``actor_execute`` request.

    Calling an actor method through its handle costs a hop to the event loop per call (and one
    more to wait); sending the request from the loop lets a batch send all its calls in one hop.
    A lost connection is handled as the handle does: wait for the actor's future if it is still
    pending and retry, else ``OSError("Unable to contact Actor's worker")``.
    """
    from distributed.protocol import to_serialize

    while True:
        try:
            result = await handle._worker_rpc.actor_execute(
                function=method,
                actor=handle.key,
                args=[to_serialize(a) for a in args],
                kwargs={k: to_serialize(v) for k, v in kwargs.items()},
            )
        except OSError:
            future = handle._future
            if future is not None and not future.done():
                await future
                continue
            raise OSError(_UNREACHABLE_TEXT) from None
        if result["status"] == "OK":
            return result["result"]
        raise result["exception"]


def run_on_loop(handle: Any, fn: Callable[[], Any]) -> Any:
    """Run coroutine function ``fn`` on the event loop of the client or worker ``handle`` is bound to.

    ``Actor._sync`` needs ``Worker.thread_id``, which a worker does not set, so a handle bound to a
    worker but to no client (deserialised outside a task) cannot use it.
    """
    from distributed.utils import sync

    client = handle_client(handle)
    if client is not None:
        return client.sync(fn)
    worker = vars(handle).get("_worker")
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    return sync(worker.loop, fn)


def start_shard(client: Any, cls: type, args: Sequence[Any], worker: str, key: str) -> Any:
    """Submit actor ``cls(*args)`` pinned to ``worker`` under ``key``; returns its future."""
    return client.submit(cls, *args, actor=True, workers=[worker], allow_other_workers=False, key=key, pure=False)


def is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` from a shard call may mean the shard's worker is gone (then the scheduler is asked).

    Dask raises ``RuntimeError("Worker holding Actor was lost ...")`` for a handle whose actor
    future failed, ``OSError("Unable to contact Actor's worker")`` (or a ``CommClosedError``)
    when the connection breaks, and the actor future's own error or a cancellation while a call
    waits on it. The bank's own errors (bad input, store errors) never mean a lost shard.
    """
    from distributed.scheduler import KilledWorker

    if isinstance(exc, ShardLostError):
        return True
    if isinstance(exc, CarlsError):
        return False
    return isinstance(exc, OSError | RuntimeError | asyncio.CancelledError | KilledWorker | TimeoutError)


def shard_error(name: str, s: int, exc: BaseException, limit: float) -> BaseException:
    """The bank's error for ``exc`` from a call to shard ``s`` (distributed's lost-actor errors become
    :class:`ShardLostError`, a timeout :class:`DeadlineExceeded`; others are returned as they are)."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return DeadlineExceeded(f"bank {name!r}: shard {s} did not answer within {limit:g} s")
    if isinstance(exc, OSError) and _UNREACHABLE_TEXT in str(exc):
        return ShardLostError(f"bank {name!r}: shard {s} cannot be reached ({exc})")
    if isinstance(exc, RuntimeError) and _LOST_TEXT in str(exc):
        return ShardLostError(f"bank {name!r}: shard {s} was lost with its worker")
    return exc


async def watch_all(tasks: Sequence[Any], handles: Sequence[Any], limit: float) -> list[Any]:
    """Await shard calls for at most ``limit`` seconds each, failing a call early if its actor is lost.

    ``tasks[i]`` (an :class:`asyncio.Task`) is a call to the actor of ``handles[i]``. A call in flight
    when its worker dies may never resolve (Dask leaves the call's future unset when the actor's own
    future is cancelled), so while calls are waited for, the actor futures' status is checked every
    half second and the scheduler is asked every two seconds whether a worker still holds each
    actor. Returns each call's answer, or the exception it ended with (:class:`ShardLostError` for a
    lost actor, :class:`TimeoutError` past ``limit``).
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    out: dict[int, Any] = {}
    pending = {t: i for i, t in enumerate(tasks)}
    rounds = 0
    while pending:
        done, _ = await asyncio.wait(set(pending), timeout=max(0.0, min(_WATCH_INTERVAL, end - loop.time())))
        for t in done:
            i = pending.pop(t)
            out[i] = asyncio.CancelledError() if t.cancelled() else (t.exception() or t.result())
        if not pending:
            break
        rounds += 1
        for t, i in list(pending.items()):
            handle = handles[i]
            lost = handle_lost(handle)
            if not lost and rounds % 4 == 0:  # every 2 s: does the scheduler still know the actor's worker?
                try:
                    lost = not await scheduler_holds(handle)
                except Exception:  # the scheduler did not answer: keep waiting for the call
                    logger.debug("who_has of %s failed", handle.key, exc_info=True)
            if lost or loop.time() >= end:
                t.cancel()
                pending.pop(t)
                out[i] = (ShardLostError(f"bank shard actor {handle.key}: its worker was lost while a call waited")
                          if lost else TimeoutError(f"no answer within {limit:g}s"))
    return [out[i] for i in range(len(tasks))]


# -- the shard table --------------------------------------------------------------------------------
class ShardTable:
    """The shards of a Dask bank as one copy of its client knows them: per shard an actor handle and
    a generation (how often it was re-homed). Re-homing replaces entries (:meth:`replace`).

    Parameters
    ----------
    name
        The bank's name.
    handles
        One actor handle per shard.
    generations
        Generation of each shard; zeros by default.
    client
        The :class:`distributed.Client` to use for re-homing; default the one the handles are bound
        to, else the current one. Not pickled.
    """

    def __init__(self, name: str, handles: Sequence[Any], generations: Sequence[int] | None = None,
                 client: Any = None) -> None:
        self.name = name
        self.handles = list(handles)
        self.generations = [0] * len(self.handles) if generations is None else [int(g) for g in generations]
        self.client = client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "client": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.handles)

    @property
    def keys(self) -> list[str]:
        """The actor key of each shard."""
        return [str(h.key) for h in self.handles]

    @property
    def addresses(self) -> list[str]:
        """The worker address of each shard."""
        return [handle_address(h) for h in self.handles]

    def replace(self, s: int, handle: Any, generation: int) -> None:
        """Point shard ``s`` at a new actor (re-homed here or by another copy)."""
        self.handles[s] = handle
        self.generations[s] = int(generation)

    def dask_client(self) -> Any:
        """The client to talk to the scheduler with."""
        if self.client is not None:
            return self.client
        for h in self.handles:
            if (c := handle_client(h)) is not None:
                return c
        from distributed import get_client

        return get_client()

    @classmethod
    def from_keys(cls, name: str, shard_cls: type, keys: Sequence[str], addresses: Sequence[str],
                  generations: Sequence[int], client: Any = None) -> ShardTable:
        """A table of handles built from actor keys and worker addresses (as the scheduler stores them)."""
        handles = [actor_handle(shard_cls, k, a) for k, a in zip(keys, addresses, strict=True)]
        return cls(name, handles, generations, client)


# -- the Dask transport -----------------------------------------------------------------------------
class DaskTransport:
    """Shards as Dask actors (see the module notes for its fast paths).

    Parameters
    ----------
    table
        The shards.
    rehome_timeout
        How long a call waits for a lost shard to be re-homed (``carls.bank.rehome-timeout``).
    futures
        The actor futures; the creator holds them (so the actors live) and releases them on
        :meth:`release`. Copies (pickled into tasks) hold none.
    """

    kind = "dask"

    def __init__(self, table: ShardTable, rehome_timeout: float, futures: Sequence[Any] = ()) -> None:
        self.table = table
        self.rehome_timeout = float(rehome_timeout)
        self.futures = list(futures)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "futures": []}  # the creator keeps the actors alive; copies only call them

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.table)

    @property
    def owns_shards(self) -> bool:
        """Whether this copy started the shards (and closes them)."""
        return bool(self.futures)

    @classmethod
    def start(cls, client: Any, name: str, cls_: type, args: Sequence[Sequence[Any]], workers: Sequence[str],
              timeout: float, rehome_timeout: float) -> DaskTransport:
        """Start actor ``cls_(*args[s])`` for each shard ``s`` on ``workers[s]`` (keys ``<name>-shard-<s>``).

        Raises
        ------
        DeadlineExceeded
            If the shards did not start within ``timeout`` seconds.
        """
        futures = [start_shard(client, cls_, a, w, f"{name}-shard-{s}")
                   for s, (a, w) in enumerate(zip(args, workers, strict=True))]
        try:
            handles = [f.result(timeout=timeout) for f in futures]
        except TimeoutError as exc:
            for f in futures:
                f.release()
            raise DeadlineExceeded(f"bank {name!r}: shards did not start within {timeout:g} s") from exc
        return cls(ShardTable(name, handles, client=client), rehome_timeout, futures)

    # -- calls --------------------------------------------------------------------------------------
    def local_shard(self, s: int) -> Any:
        """The shard object itself when it lives in this process (a task on its worker), else None."""
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return None
        handle = self.table.handles[s]
        if getattr(handle, "_address", None) != worker.address:
            return None
        return worker.state.actors.get(handle.key)

    def call(self, calls: Sequence[ShardCall], timeout: float) -> list[Any]:
        """Issue every call, then wait for all of them (each within ``timeout``); answers in order.

        Shards living in the caller's process are called directly, after the remote calls have been
        issued. Calls of a lost shard are retried on its re-homed actor; other errors are raised.
        """
        local = {s: self.local_shard(s) for s in {c.shard for c in calls}}
        # with no co-located shard, the remote calls are sent together from the event loop when awaited;
        # otherwise they are sent now, so that they run while the co-located shards are called directly
        deferred = all(shard is None for shard in local.values())
        pending = [None if local[c.shard] is not None else self._issue(c, deferred) for c in calls]
        stages.mark("client", "issuing calls")
        answers: dict[int, Any] = {
            i: self._direct(local[c.shard], c) for i, c in enumerate(calls) if local[c.shard] is not None
        }
        remote = [(i, calls[i].shard, fut) for i, fut in enumerate(pending) if fut is not None]
        if remote:
            answers.update(zip([i for i, _, _ in remote], self._wait(remote, timeout), strict=True))
            stages.mark("client", "waiting")
        if any(isinstance(a, Failed) for a in answers.values()):
            self._recover(calls, answers, timeout)
        return [answers[i] for i in range(len(calls))]

    @staticmethod
    def _direct(shard: Any, c: ShardCall) -> Any:
        """Call a co-located shard; one that was retired (its worker is closing) re-routes the call."""
        try:
            return getattr(shard, c.method)(*c.args, **c.send_kwargs)
        except ShardLostError as exc:
            return Failed(exc)

    def _issue(self, c: ShardCall, deferred: bool) -> Any:
        """Send one call (or, ``deferred``, prepare it to be sent from the event loop when awaited); a
        handle whose actor is already known lost fails here."""
        try:
            handle = self.table.handles[c.shard]
            if not deferred:
                return getattr(handle, c.method)(*c.args, **c.send_kwargs)
            if handle_lost(handle):
                raise RuntimeError(f"{_LOST_TEXT}.  Status: {handle._future.status}")
            return execute(handle, c.loop_method or c.method, c.args, c.send_kwargs)
        except Exception as exc:
            return Failed(exc)

    def _wait(self, remote: Sequence[tuple[int, int, Any]], limit: float) -> list[Any]:
        """Wait for all remote calls in one hop to the event loop; failures come back as :class:`Failed`."""

        async def one(fut: Any) -> Any:
            return await fut

        async def all_of() -> list[Any]:
            tasks = [asyncio.ensure_future(fut if asyncio.iscoroutine(fut) else one(fut)) for _, _, fut in remote]
            return await watch_all(tasks, [self.table.handles[s] for _, s, _ in remote], limit)

        issued = [s for _, s, fut in remote if not isinstance(fut, Failed)]
        if not issued:  # nothing reached a shard: no trip to the event loop
            return [fut for _, _, fut in remote]
        handle = self.table.handles[issued[0]]  # bound to this process's worker or client when issued
        results = run_on_loop(handle, all_of)
        return [Failed(res) if isinstance(res, BaseException) else res for res in results]

    def _recover(self, calls: Sequence[ShardCall], answers: dict[int, Any], limit: float) -> None:
        """Re-home the shards of failed calls whose worker is gone and retry those calls (same op ids).

        Waits at most ``rehome_timeout`` per shard; errors that do not mean a lost shard are raised
        as they are.
        """
        from carls_dask.bank.rehoming import adopt_or_rehome

        name = self.table.name
        for i, answer in sorted(answers.items()):
            if not isinstance(answer, Failed):
                continue
            c, exc = calls[i], answer.exc
            deadline = time.monotonic() + self.rehome_timeout
            while True:
                if not is_lost(exc):
                    raise shard_error(name, c.shard, exc, limit) from exc
                handle = adopt_or_rehome(self.table, c.shard, exc, deadline, limit=self.rehome_timeout)
                if handle is None:  # the shard's worker is alive: the error stands
                    raise shard_error(name, c.shard, exc, limit) from exc
                try:
                    answers[i] = getattr(handle, c.method)(*c.args, **c.send_kwargs).result(
                        timeout=max(0.1, min(limit, deadline - time.monotonic())))
                    break
                except Exception as again:
                    if time.monotonic() >= deadline:
                        raise ShardLostError(
                            f"bank {name!r}: shard {c.shard} was not back within carls.bank.rehome-timeout "
                            f"({self.rehome_timeout:g}s): {again!r}") from again
                    exc = again

    # -- lifecycle ----------------------------------------------------------------------------------
    def rehoming(self) -> dict[str, Any]:
        """Re-homings of the bank so far (see :func:`carls_dask.bank.rehoming.rehome_stats`)."""
        from carls_dask.bank.rehoming import rehome_stats

        return rehome_stats(self.table)

    def release(self) -> None:
        """Forget the published shard table and release the actors (the creator's copy only)."""
        if not self.futures:
            return
        from carls_dask.bank.rehoming import forget_table

        forget_table(self.table)
        for f in self.futures:
            f.release()
        self.futures = []
