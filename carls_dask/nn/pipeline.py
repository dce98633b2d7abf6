"""The order of a layer's bank calls: reads, prefetches and gradient pushes, with bounded staleness.

Every bank call of a layer goes through one :class:`RowPipeline`, which runs them in the order they were
submitted (a single worker thread, or the caller's thread). That order is what makes staleness exact
to count: a read includes every gradient push submitted before it and none submitted after it.

Without prefetching a layer reads its rows in ``forward`` (after every earlier push) and pushes its
gradients in ``backward``: the same order as :class:`torch.nn.Embedding` with a sparse optimizer.

With :meth:`RowPipeline.prefetch` a trainer asks for the next batch's rows before it runs the current
step, so the read travels while the step computes and the step's gradient push travels while the next
forward runs. The rows it gets were read before the current step's push, so a row the two batches share
misses that one update. This is PERSIA's model of bounded staleness rather than TorchRec's
``TrainPipelineSparseDist`` (which overlaps only the input's movement and keeps the exact order): the bank
is a remote store, so the read itself is what must overlap the step, and that read cannot see the
gradient of a step that has not finished. The bound ``staleness`` counts, per row, the updates a read
missed; a row over the bound is read again once the pushes it missed have landed, so ``staleness=0`` gives
the exact order at the cost of re-reading the rows consecutive batches share. What was missed is counted
and reported by :meth:`RowPipeline.stats`.

In-process shards (:meth:`KnowledgeBank.local <carls_dask.bank.KnowledgeBank.local>`) are not thread safe,
so there the calls run in the caller's thread at submission: the same order, the same staleness, nothing
overlapped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError, DeadlineExceeded
from carls_dask.nn.table import BankColumn

__all__ = ["PipelineStats", "RowPipeline"]

logger = logging.getLogger(__name__)

#: Prefetches a layer keeps waiting for a forward that asks for their keys.
MAX_PREFETCHES = 4


@dataclasses.dataclass
class PipelineStats:
    """What a layer's reads missed and waited for, since it was built (or :meth:`RowPipeline.reset_stats`).

    Attributes
    ----------
    reads
        Forward reads served (prefetched or not).
    prefetched
        Reads served from a prefetch.
    rows
        Rows served.
    stale_rows
        Rows served that missed at least one gradient update of their own.
    max_staleness
        Most updates of one row that a served read missed (never above the layer's bound).
    refetched_rows
        Rows read again because they missed more updates than the bound allows.
    discarded
        Prefetches dropped unused (the next forward asked for other keys).
    pushes
        Gradient pushes submitted.
    push_s
        Seconds backward spent submitting pushes (the whole bank call when the pipeline runs inline).
    wait_s
        Seconds forwards waited for their rows.
    push_wait_s
        Seconds spent waiting for pushes to land (:meth:`RowPipeline.flush` and re-reads).
    """

    reads: int = 0
    prefetched: int = 0
    rows: int = 0
    stale_rows: int = 0
    max_staleness: int = 0
    refetched_rows: int = 0
    discarded: int = 0
    pushes: int = 0
    push_s: float = 0.0
    wait_s: float = 0.0
    push_wait_s: float = 0.0

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """The counters as run metrics (``stale_row_fraction`` added), names prefixed by ``prefix``."""
        out = {f"{prefix}{k}": float(v) for k, v in dataclasses.asdict(self).items()}
        out[f"{prefix}stale_row_fraction"] = self.stale_rows / self.rows if self.rows else 0.0
        return out


@dataclasses.dataclass
class _Read:
    """A read in flight: its keys, whether it inserts, the pushes it includes and its answer.

    ``missed`` counts, per key, updates missed before the pipeline knew of the read (a read carried
    over from a checkpoint).
    """

    keys: np.ndarray
    insert: bool
    after: int
    future: concurrent.futures.Future[np.ndarray]
    missed: np.ndarray | None = None


@dataclasses.dataclass
class _Push:
    """A submitted gradient push: its sequence number, unique keys and future."""

    seq: int
    keys: np.ndarray
    future: concurrent.futures.Future[Any]


class _Inline:
    """Runs each job at submission in the caller's thread (in-process shards)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # kept for the caller, as a worker thread would keep it
            fut.set_exception(exc)
        return fut

    def shutdown(self, wait: bool = True) -> None:
        """Nothing runs in the background."""


class RowPipeline:
    """Runs a layer's bank reads and gradient pushes in submission order and counts their staleness.

    Parameters
    ----------
    column
        The bank column read and trained.
    staleness
        Most updates of its own a served row may have missed (0: exact order).
    asynchronous
        Run the bank calls on a worker thread (ignored for in-process shards, which run inline).
    timeout
        Seconds one wait for a read or a push may take (default four times the bank's call timeout).
    """

    def __init__(self, column: BankColumn, *, staleness: int = 1, asynchronous: bool = False,
                 timeout: float | None = None) -> None:
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(f"{column.owner}: staleness={staleness!r}; expected an int >= 0 (0: exact order)")
        self.column = column
        self.staleness = int(staleness)
        local = getattr(getattr(column.bank, "transport", None), "kind", "") == "local"
        self.asynchronous = bool(asynchronous) and not local
        self.timeout = float(timeout) if timeout is not None else 4.0 * float(getattr(column.bank, "timeout", 60.0))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._executor: Any = None
        self._seq = 0
        self._pushes: collections.deque[_Push] = collections.deque()
        self._reads: collections.deque[_Read] = collections.deque()
        self.stats = PipelineStats()

    # -- pickling: a copy starts with nothing in flight -----------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"column": self.column, "staleness": self.staleness, "asynchronous": self.asynchronous,
                "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- jobs --------------------------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        if self._executor is None:
            if self.asynchronous:
                ex = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"bank-layer-{self.column.table}")
                weakref.finalize(self, ex.shutdown, wait=False)
                self._executor = ex
            else:
                self._executor = _Inline()
        if not self.asynchronous:
            return self._executor.submit(fn, *args)
        # the worker thread runs each call in the submitting thread's context: a trainer task's calls then
        # find their Dask worker (distributed keeps it in a context variable) as they would in the task
        return self._executor.submit(contextvars.copy_context().run, fn, *args)

    def _result(self, fut: concurrent.futures.Future[Any], what: str) -> Any:
        try:
            return fut.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise DeadlineExceeded(f"{self.column.owner}: {what} did not finish within {self.timeout:g}s "
                                   f"(table {self.column.table!r}); expected the bank to answer") from None

    def _raise_failed_pushes(self) -> None:
        """Raise the error of the oldest failed push (once), and forget the pushes no prefetch needs."""
        failed = next((p for p in self._pushes if p.future.done() and p.future.exception() is not None), None)
        if failed is not None:  # it never landed, so no read missed it
            self._pushes.remove(failed)
            exc = failed.future.exception()
            assert exc is not None
            raise exc
        oldest = self._reads[0].after if self._reads else self._seq
        while self._pushes and self._pushes[0].future.done() and self._pushes[0].seq < oldest:
            self._pushes.popleft()

    # -- reads ---------------------------------------------------------------------------------------------
    def prefetch(self, keys: np.ndarray, insert: bool) -> None:
        """Start reading the rows of ``keys`` now (after every push submitted so far)."""
        self._raise_failed_pushes()
        while len(self._reads) >= MAX_PREFETCHES:  # unmatched prefetches: the oldest goes
            self._reads.popleft()
            self.stats.discarded += 1
        fut = self._submit(self.column.read, keys, insert)
        self._reads.append(_Read(keys, bool(insert), self._seq, fut))

    def read(self, keys: np.ndarray, insert: bool) -> np.ndarray:
        """Rows of ``keys`` for a forward: a matching prefetch when there is one, else read now.

        A prefetch matches when it asked for the same keys with the same ``insert``; prefetches queued
        before it are discarded. Rows that missed more than ``staleness`` updates are read again once
        those updates have landed.
        """
        self._raise_failed_pushes()
        t0 = time.perf_counter()
        at = next((i for i, r in enumerate(self._reads)
                   if r.insert == bool(insert) and r.keys.shape == keys.shape and np.array_equal(r.keys, keys)), None)
        match = None
        if at is not None:  # prefetches queued before the match were never used
            for _ in range(at):
                self._reads.popleft()
                self.stats.discarded += 1
            match = self._reads.popleft()
        if match is None:
            rows = self._result(self._submit(self.column.read, keys, insert), "a read")
            missed = np.zeros(keys.shape[0], dtype=np.int64)
        else:
            rows = self._result(match.future, "a prefetched read")
            self.stats.prefetched += 1
            missed = self._missed(keys, match.after)
            if match.missed is not None:
                missed += match.missed
            over = missed > self.staleness
            if over.any():
                rows = self._refetch(rows, keys, over, missed)
        self.stats.reads += 1
        self.stats.rows += int(keys.shape[0])
        self.stats.stale_rows += int(np.count_nonzero(missed))
        if missed.size:
            self.stats.max_staleness = max(self.stats.max_staleness, int(missed.max()))
        self.stats.wait_s += time.perf_counter() - t0
        return rows

    def _missed(self, keys: np.ndarray, after: int) -> np.ndarray:
        """Per key, the submitted pushes with sequence ``>= after`` that touch it (updates the read missed)."""
        missed = np.zeros(keys.shape[0], dtype=np.int64)
        for p in self._pushes:
            if p.seq >= after:
                missed += np.isin(keys, p.keys, assume_unique=False)
        return missed

    def _refetch(self, rows: np.ndarray, keys: np.ndarray, over: np.ndarray, missed: np.ndarray) -> np.ndarray:
        """Read the rows over the bound again after every push so far (the read is queued behind them)."""
        t0 = time.perf_counter()
        fresh = self._result(self._submit(self.column.read, keys[over], False), "a re-read of stale rows")
        self.stats.push_wait_s += time.perf_counter() - t0
        rows = rows.copy() if not rows.flags.writeable else rows
        rows[over] = fresh
        missed[over] = 0
        self.stats.refetched_rows += int(np.count_nonzero(over))
        return rows

    # -- gradients -----------------------------------------------------------------------------------------
    def push(self, keys: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> None:
        """Submit a gradient push of unique ``keys`` (returns before it lands when asynchronous)."""
        t0 = time.perf_counter()
        with self._lock:
            seq = self._seq
            self._seq += 1
        fut = self._submit(self.column.push, keys, grads, learning_rate)
        self._pushes.append(_Push(seq, keys, fut))
        self.stats.pushes += 1
        self.stats.push_s += time.perf_counter() - t0
        if not self.asynchronous:
            self._raise_failed_pushes()

    def flush(self) -> None:
        """Wait until every submitted push has landed; raises the error of the first that failed (once)."""
        t0 = time.perf_counter()
        for p in list(self._pushes):
            try:
                self._result(p.future, "a gradient push")
            except DeadlineExceeded:
                raise
            except Exception:  # raised below, in order, by the push that failed
                logger.debug("%s: a gradient push failed", self.column.owner, exc_info=True)
        self.stats.push_wait_s += time.perf_counter() - t0
        self._raise_failed_pushes()

    def export_prefetches(self) -> list[dict[str, Any]]:
        """The prefetched reads not used yet, answered (waits for them), with the updates each row missed so far.

        A trainer's checkpoint keeps them, so that a run resumed from it serves the next forward the rows an
        uninterrupted run serves (rows read before the last step's push, not after it).
        """
        out = []
        for r in self._reads:
            rows = self._result(r.future, "a prefetched read")
            missed = self._missed(r.keys, r.after) + (0 if r.missed is None else r.missed)
            out.append({"keys": r.keys, "insert": r.insert, "rows": np.array(rows), "missed": missed})
        return out

    def import_prefetches(self, reads: list[dict[str, Any]]) -> None:
        """Queue reads from :meth:`export_prefetches` as answered prefetches."""
        for r in reads:
            fut: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
            fut.set_result(np.asarray(r["rows"]))
            self._reads.append(_Read(np.asarray(r["keys"], dtype=np.int64), bool(r["insert"]), self._seq, fut,
                                     np.asarray(r["missed"], dtype=np.int64)))

    def pending(self) -> int:
        """Pushes submitted that have not landed yet."""
        return sum(not p.future.done() for p in self._pushes)

    def close(self) -> None:
        """:meth:`flush`, then stop the worker thread."""
        try:
            self.flush()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def reset_stats(self) -> PipelineStats:
        """Return the counters so far and start new ones."""
        out, self.stats = self.stats, PipelineStats()
        return out
