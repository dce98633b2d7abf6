"""How calls reach the bank's shards: the transports that carry a batch of calls.

A call to a shard is a value, :class:`~carls_dask.bank.calls.ShardCall`, built by the client method that
knows what it is (a read, a mutating batch with an operation id, a read the shard may serve on its event
loop); the client sends at most one per shard at a time (:func:`~carls_dask.bank.calls.fuse`). A
transport sends such calls and returns the answers in order:

* :class:`LocalTransport`: the shards are :class:`~carls_dask.bank.actor.BankShard` objects held in
  this process and called directly (``KnowledgeBank.local``; no cluster).
* :class:`DaskTransport`: one Dask actor per shard (``KnowledgeBank.create``). Its fast paths: a
  shard living in the caller's process (a task on the shard's worker) is called directly; remote
  calls of a batch are sent together in one hop to the event loop (``actor_execute`` requests sent
  from the loop); short calls run on the shard worker's event loop (``ShardCall.on_loop``); one
  watchdog waits for all of them; failed calls of a lost shard are re-homed
  (:mod:`carls_dask.bank.rehoming`) and retried with the same operation id.

Everything that touches distributed's actor internals (handles, ``actor_execute`` requests, the
watchdog) is in :mod:`carls_dask.bank.actor_internals`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Sequence
from typing import Any

from carls_dask.bank import stages
from carls_dask.bank.actor_internals import (
    LOST_TEXT,
    ShardTable,
    execute,
    handle_lost,
    is_lost,
    local_actor,
    release_handle,
    run_on_loop,
    send_call,
    shard_error,
    start_shard,
    watch_all,
)
from carls_dask.bank.calls import Failed, ShardCall, new_op_id, stamp_op_ids
from carls_dask.bank.rehoming import adopt_or_rehome, forget_table, rehome_stats
from carls_dask.errors import DeadlineExceeded, LifecycleError, ShardLostError

__all__ = ["DaskTransport", "Failed", "LocalTransport", "ShardCall", "new_op_id", "stamp_op_ids"]

logger = logging.getLogger(__name__)


def _failed(error: BaseException, cause: BaseException) -> Failed:
    """``error`` as a call's answer, caused by ``cause`` when it stands for it (never an error caused by itself: a
    cycle of causes, which whoever walks the chain, distributed's error report of a failed task among them,
    never leaves)."""
    if error is not cause:
        error.__cause__ = cause
    return Failed(error)


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
        """Call each shard in turn; returns the answers in the order of ``calls``, a call that raised as its
        :class:`Failed` (``timeout`` does not apply: the calls run in this thread)."""
        stages.mark("client", "issuing calls")
        out: list[Any] = []
        for c in calls:
            try:
                out.append(getattr(self.shards[c.shard], c.method)(*c.args, **c.send_kwargs))
            except Exception as exc:
                out.append(Failed(exc))
        return out

    def local_shard(self, s: int) -> Any:
        """The shard object ``s`` (always in this process)."""
        return self.shards[s]

    def rehoming(self) -> dict[str, Any]:
        """In-process shards are never re-homed."""
        return {"count": 0, "generation": [0] * self.n_shards, "events": []}

    def release(self) -> None:
        """Drop the shards (after their ``close``)."""
        self.shards = []


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
        return local_actor(self.table.handles[s])

    def call(self, calls: Sequence[ShardCall], timeout: float) -> list[Any]:
        """Issue every call, then wait for all of them (each within ``timeout``); answers in order.

        Shards living in the caller's process are called directly, after the remote calls have been
        issued. Calls of a lost shard are retried on its re-homed actor; a call that failed otherwise
        answers its :class:`Failed` (the bank's error for it), so the other calls' answers stand.

        Raises
        ------
        LifecycleError
            If the Dask client the shards are reached through was closed (nothing is sent).
        """
        closed = self.table.closed_client()
        if closed is not None:
            raise LifecycleError(
                f"bank {self.table.name!r}: the Dask client it reaches its shards through is {closed}, so no call "
                "can reach them; keep the client open while the bank is used (close the bank first, or use a "
                "Workbench, which does), or restore the bank with a live client: "
                "KnowledgeBank.restore(client, RUN/bank)")
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
        except Exception as exc:
            return Failed(exc)

    def _issue(self, c: ShardCall, deferred: bool) -> Any:
        """Send one call (or, ``deferred``, prepare it to be sent from the event loop when awaited); a
        handle whose actor is already known lost fails here."""
        try:
            handle = self.table.handles[c.shard]
            if handle_lost(handle):
                raise RuntimeError(f"{LOST_TEXT}.  Status: {handle._future.status}")
            method, args = ("call_on_loop", (c.method, *c.args)) if c.on_loop else (c.method, c.args)
            if not deferred:
                return send_call(handle, method, args, c.send_kwargs)
            return execute(handle, method, args, c.send_kwargs)
        except Exception as exc:
            return Failed(exc)

    def _wait(self, remote: Sequence[tuple[int, int, Any]], limit: float) -> list[Any]:
        """Wait for all remote calls in one hop to the event loop; failures come back as :class:`Failed`."""

        async def one(fut: Any) -> Any:
            return await (asyncio.wrap_future(fut) if isinstance(fut, concurrent.futures.Future) else fut)

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

        Waits at most ``rehome_timeout`` per shard (then raises :class:`ShardLostError`); an error that
        does not mean a lost shard stays that call's answer, as the bank's error for it.
        """
        name = self.table.name
        for i, answer in sorted(answers.items()):
            if not isinstance(answer, Failed):
                continue
            c, exc = calls[i], answer.exc
            deadline = time.monotonic() + self.rehome_timeout
            while True:
                if not is_lost(exc):
                    answers[i] = _failed(shard_error(name, c.shard, exc, limit), exc)
                    break
                handle = adopt_or_rehome(self.table, c.shard, exc, deadline, limit=self.rehome_timeout)
                if handle is None:  # the shard's worker is alive: the error stands
                    answers[i] = _failed(shard_error(name, c.shard, exc, limit), exc)
                    break
                try:
                    answers[i] = send_call(handle, c.method, c.args, c.send_kwargs).result(
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
        return rehome_stats(self.table)

    def release(self) -> None:
        """Forget the published shard table and release the actors (the creator's copy only).

        Every handle holds a future of its actor, as the futures the shards were started with do: all are
        released, so the scheduler lets the workers drop the shards (and their rows) now, not when the
        bank object is garbage collected.
        """
        if not self.futures:
            return
        forget_table(self.table)
        for f in self.futures:
            f.release()
        for h in self.table.handles:
            release_handle(h)
        self.futures = []
