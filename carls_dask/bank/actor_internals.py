"""What the bank relies on in distributed's actor machinery: the one module that touches its internals.

The bank's transport (:mod:`carls_dask.bank.transport`) and re-homing (:mod:`carls_dask.bank.rehoming`)
reach the shard actors only through these functions and :class:`ShardTable`, the table of a bank's actor
handles. Written against ``distributed`` 2026.8.0 (``dask`` 2026.8.0). Besides the public API
(``Client.submit(..., actor=True)``, actor method calls and their ``.result()``, ``Client.who_has``,
``get_worker``/``get_client``), it relies on these internals, each checked by a named test in
``tests/bank/test_actor_internals.py``:

* ``Actor._address``: the address of the worker holding the actor (:func:`handle_address`);
* ``Actor._future``: the actor task's future on a client, ``None`` on other copies, whose status
  leaves ``"finished"``/``"pending"`` when the actor is lost (:func:`handle_lost`), and which holds the
  actor until it is released (:func:`release_handle`);
* ``Actor._worker_rpc.actor_execute(function=, actor=, args=, kwargs=)`` with serialisable
  arguments answers ``{"status": "OK", "result": ...}`` or ``{"status": "error", "exception": ...}``,
  and awaits a coroutine method on the worker's event loop (:func:`execute`);
* ``Actor._scheduler_rpc.who_has(keys=[...])`` answers ``{key: [addresses]}`` (:func:`scheduler_holds`);
* ``vars(actor)["_client"]``/``vars(actor)["_worker"]``: what the handle is bound to (a client's
  ``status`` is ``"closing"`` or ``"closed"`` once it was closed: :meth:`ShardTable.closed_client`), and
  ``distributed.utils.sync(worker.loop, fn)`` to run on a worker's loop (:func:`run_on_loop`); the
  asyncio loop under that client's or worker's tornado ``IOLoop`` (``IOLoop.asyncio_loop``) to start a
  call there without waiting (:func:`send_call`);
* ``Actor(cls, address, key)`` builds a handle from a key and an address (:func:`actor_handle`);
* ``Worker.state.actors[key]`` holds the actor object itself (:func:`worker_actors`, co-located calls);
* ``Worker._get_client()``: a client of the worker's scheduler from a worker thread (:func:`worker_client`);
* the error texts ``"Worker holding Actor was lost"`` and ``"Unable to contact Actor's worker"`` of a
  lost actor (:func:`shard_error`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from carls_dask.errors import CarlsError, DeadlineExceeded, ShardLostError

__all__ = [
    "LOST_TEXT",
    "ShardTable",
    "actor_alive",
    "actor_handle",
    "execute",
    "handle_address",
    "handle_client",
    "handle_lost",
    "is_lost",
    "local_actor",
    "release_handle",
    "run_on_loop",
    "scheduler_holds",
    "send_call",
    "shard_error",
    "start_shard",
    "watch_all",
    "worker_actors",
    "worker_client",
]

logger = logging.getLogger(__name__)

#: The error text distributed gives a call to a handle whose actor future failed.
LOST_TEXT = "Worker holding Actor was lost"
#: The error text distributed gives a call whose connection to the actor's worker broke.
_UNREACHABLE_TEXT = "Unable to contact Actor's worker"
_WATCH_INTERVAL = 0.5  # seconds between checks of a waited-on shard's actor future


# -- handles and calls -------------------------------------------------------------------------------
def handle_address(handle: Any) -> str:
    """Address of the worker holding the actor of ``handle``."""
    return str(handle._address)


def handle_lost(handle: Any) -> bool:
    """Whether the actor future this handle holds (a client's handle) says the actor is gone."""
    future = getattr(handle, "_future", None)
    return future is not None and future.status not in ("finished", "pending")


def release_handle(handle: Any) -> None:
    """Drop the hold the handle's actor future keeps on the actor, so that the scheduler can release it."""
    future = getattr(handle, "_future", None)
    if future is not None:
        future.release()


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


def local_actor(handle: Any) -> Any:
    """The actor object of ``handle`` when it lives in this process (a task on its worker), else None."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    if getattr(handle, "_address", None) != worker.address:
        return None
    return worker.state.actors.get(handle.key)


def actor_alive(client: Any, key: str) -> bool:
    """Whether the scheduler knows a worker holding the actor ``key``."""
    who = client.who_has([key])
    return bool(who.get(key))


async def scheduler_holds(handle: Any) -> bool:
    """On the event loop: whether the scheduler still knows a worker holding the actor of ``handle``."""
    who = await handle._scheduler_rpc.who_has(keys=[handle.key])
    return bool(who.get(handle.key))


def _wire(value: Any) -> Any:
    """An argument as sent: plain values (a table name, a flag, an operation id, a list of column names) go
    in the message itself; anything else (arrays, dicts of arrays) is serialised apart."""
    from distributed.protocol import to_serialize

    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is list and all(type(v) is str for v in value):
        return value
    return to_serialize(value)


async def execute(handle: Any, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """On the event loop: run ``method`` of the actor of ``handle`` with one ``actor_execute`` request.

    Calling an actor method through its handle costs a hop to the event loop per call (and one
    more to wait); sending the request from the loop lets a batch send all its calls in one hop.
    A lost connection is handled as the handle does: wait for the actor's future if it is still
    pending and retry, else ``OSError("Unable to contact Actor's worker")``.
    """
    while True:
        try:
            result = await handle._worker_rpc.actor_execute(
                function=method,
                actor=handle.key,
                args=[_wire(a) for a in args],
                kwargs={k: _wire(v) for k, v in kwargs.items()},
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


def send_call(handle: Any, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> concurrent.futures.Future:
    """Start ``method`` of the actor of ``handle`` (:func:`execute`) on the event loop of the client or worker the
    handle is bound to, and return a future of its answer at once.

    Used instead of calling the handle's method (``handle.method(...)``): distributed runs that call as a loop
    callback, and when the actor's worker dies while it waits, the loop logs the callback's error (a
    ``FutureCancelledError`` traceback on the console) besides the caller seeing it. Here the error lands in
    the returned future only: the caller handles a lost shard (re-homing) and nothing reaches the console.
    """
    client = handle_client(handle)
    if client is not None:
        io_loop = client.loop
    else:
        worker = vars(handle).get("_worker")
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        io_loop = worker.loop
    return asyncio.run_coroutine_threadsafe(execute(handle, method, args, kwargs), io_loop.asyncio_loop)


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
    if isinstance(exc, RuntimeError) and LOST_TEXT in str(exc):
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

    def closed_client(self) -> str | None:
        """The status of the client the shards are reached through when it was closed (``"closed"``,
        ``"closing"``), else ``None`` (a live client, or handles bound to a worker)."""
        clients = [self.client] if self.client is not None else []
        clients += [c for h in self.handles if vars(h).get("_worker") is None and (c := handle_client(h)) is not None]
        for c in clients:
            status = str(getattr(c, "status", "running"))
            if status in ("closing", "closed"):
                return status
        return None

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
