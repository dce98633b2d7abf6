"""The order of the layers' bank calls: one queue per bank, one message per shard per step, bounded staleness.

Every bank call of every layer over one bank object in this process goes through that bank's
:class:`BankQueue`. The queue holds what the layers ask for -- gradient pushes, prefetched reads, reads
needed now -- in the order they were asked, and sends everything it holds as one
:meth:`KnowledgeBank.batch <carls_dask.bank.client.KnowledgeBank.batch>`: one message per shard, however
many tables and layers, run by each shard in that order. Sends run one after the other (on one worker
thread, or in the caller's thread for in-process shards), so a read includes every push asked for before
it and none asked for after it: that order is what makes staleness exact to count.

When a queue sends:

- a forward needs rows that no prefetch read: everything held goes now, with that read, and the forward
  waits for it (so the gradient push of the previous step travels with the next read: one round trip a
  step, in the exact order of :class:`torch.nn.Embedding` with a sparse optimizer);
- a forward is served from a prefetch: everything held (the previous step's pushes, the next batch's
  prefetches) goes in the background and the step goes on (``pipeline=True``, the default; with
  ``pipeline=False`` the forward waits for it);
- :meth:`BankQueue.drain` (a layer's ``flush()``, ``bank.flush()``) and any other call through the same
  bank object (the queue is attached to the bank: ``bank.lookup`` or a snapshot sees every push first).

A backward sends nothing: its push waits for the next send. So a step of a model whose layers are
prefetched costs one message per shard, whatever the number of tables and layers, and a collection
(:mod:`carls_dask.nn.collection`) reads all its tables in one.

With prefetching a trainer asks for the next batch's rows before it runs the current step; they travel
while the step computes, behind the pushes of the step before. The rows they get miss the current step's
push, so a row the two batches share misses that one update. This is PERSIA's bounded staleness rather
than TorchRec's ``TrainPipelineSparseDist`` (which overlaps only the input's movement and keeps the exact
order): the bank is a remote store, so the read itself is what must overlap the step, and that read cannot
see the gradient of a step that has not finished. The bound ``staleness`` counts, per row, the updates a
read missed; a row over the bound is read again behind the pushes it missed, so ``staleness=0`` gives the
exact order at the cost of re-reading the rows consecutive batches share. What was missed is counted and
reported by :meth:`RowPipeline.stats`.
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
from typing import TYPE_CHECKING, Any

import numpy as np

from carls_dask.bank.batchpass import dedupe
from carls_dask.bank.client import CheckedPush
from carls_dask.errors import ConfigError, DeadlineExceeded
from carls_dask.nn.table import BankColumn

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["BankQueue", "PipelineStats", "RowPipeline"]

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
        Gradient pushes asked for.
    push_s
        Seconds backward spent handing pushes to the queue (checks and planning; nothing is sent there).
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
class _Push:
    """A gradient push asked for: its sequence number in its table, unique keys and future."""

    seq: int
    keys: np.ndarray
    future: concurrent.futures.Future[Any]
    _sorted: np.ndarray | None = None

    def touches(self, keys: np.ndarray) -> np.ndarray:
        """``bool[n]``: which of ``keys`` (duplicates allowed) this push updates."""
        if self._sorted is None:
            self._sorted = np.sort(self.keys)
        s = self._sorted
        if s.size == 0:
            return np.zeros(keys.shape[0], dtype=bool)
        at = np.searchsorted(s, keys)
        at[at == s.size] = 0
        return np.asarray(s[at] == keys)


@dataclasses.dataclass
class _OpenPush:
    """A push held in the batch not sent yet, which later pushes to its table may still join."""

    parts: list[CheckedPush]
    push: _Push


class BankQueue:
    """The bank calls of every layer over one bank object in this process, sent in order, fused per send.

    Get it with :meth:`of`; layers use it through their :class:`RowPipeline`. It is attached to the bank
    (:meth:`KnowledgeBank.attach <carls_dask.bank.client.KnowledgeBank.attach>`), so any other call through
    the bank object first sends what it holds.

    Parameters
    ----------
    bank
        The knowledge bank.
    """

    _queues: weakref.WeakKeyDictionary[Any, BankQueue] = weakref.WeakKeyDictionary()
    _queues_lock = threading.Lock()

    def __init__(self, bank: KnowledgeBank) -> None:
        self.bank = bank
        self.inline = getattr(getattr(bank, "transport", None), "kind", "") == "local"
        self._lock = threading.RLock()
        self._batch: Any = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._jobs: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self._seq: dict[str, int] = {}
        self._pushes: dict[str, collections.deque[_Push]] = {}
        self._open: dict[str, _OpenPush] = {}
        self._readers: dict[str, weakref.WeakSet[RowPipeline]] = {}
        bank.attach(self)

    @classmethod
    def of(cls, bank: KnowledgeBank) -> BankQueue:
        """The queue of ``bank`` in this process (made on first use)."""
        with cls._queues_lock:
            q = cls._queues.get(bank)
            if q is None:
                q = cls._queues[bank] = cls(bank)
            return q

    # -- planning (the caller's thread; every argument is checked here, before anything is sent) ----------
    def _current(self) -> Any:
        if self._batch is None:
            self._batch = self.bank.batch()
        return self._batch

    def read(self, table: str, column: str, keys: np.ndarray, insert: bool,
             counts: np.ndarray | None = None) -> tuple[int, concurrent.futures.Future[Any]]:
        """Hold a read of ``keys`` (``counts``: what each adds to its frequency with insert); returns the pushes
        to ``table`` it will include and its future (a :class:`~carls_dask.bank.core.LookupResult` once sent)."""
        with self._lock:
            self._open.pop(table, None)  # a later push to the table must not join one this read follows
            # the layer checked the keys: they are routed by the thread that sends
            return self._seq.get(table, 0), self._current().lookup(table, keys, columns=[column], insert=insert,
                                                                   counts=counts, late=True)

    def push(self, table: str, column: str, keys: np.ndarray, grads: np.ndarray, learning_rate: float | None,
             model_step: int | None = None, maker: str | None = None) -> _Push:
        """Hold a gradient push of unique ``keys`` (checked now); it travels with the next send.

        Pushes to one table held one after the other (a table used twice in a step: two features of one
        table, tied embeddings) travel as one: the shard sums a key's gradients and applies one update,
        as torch sums the gradients of a weight used twice before its optimizer steps.
        """
        checked = self.bank.check_push(table, keys, {column: grads}, column, learning_rate, model_step, maker)
        with self._lock:
            batch = self._current()
            rec = self._open.get(table)
            if rec is not None and rec.parts[0].joins(checked):
                rec.parts.append(checked)
                rec.push.keys = np.union1d(rec.push.keys, checked.keys)
                rec.push._sorted = rec.push.keys  # union1d's answer is sorted
                return rec.push
            parts = [checked]
            fut = batch.push(lambda: CheckedPush.join(parts))
            seq = self._seq.get(table, 0)
            self._seq[table] = seq + 1
            p = _Push(seq, np.asarray(keys, dtype=np.int64), fut)
            self._pushes.setdefault(table, collections.deque()).append(p)
            self._open[table] = _OpenPush(parts, p)
            return p

    def after(self, table: str) -> int:
        """Pushes to ``table`` asked for so far (a read held now includes exactly these)."""
        return self._seq.get(table, 0)

    def missed(self, table: str, keys: np.ndarray, after: int) -> np.ndarray:
        """Per key, the pushes to ``table`` with sequence ``>= after`` that touch it (updates a read missed)."""
        missed = np.zeros(keys.shape[0], dtype=np.int64)
        for p in list(self._pushes.get(table, ())):
            if p.seq >= after:
                missed += p.touches(keys)
        return missed

    def pending(self, table: str | None = None) -> int:
        """Pushes asked for that have not landed yet (of ``table``, or of every table)."""
        tables = list(self._pushes) if table is None else [table]
        return sum(not p.future.done() for t in tables for p in self._pushes.get(t, ()))

    # -- sending ------------------------------------------------------------------------------------------
    def send(self, wait: bool, timeout: float) -> None:
        """Send everything held now, as one batch (after every earlier send); ``wait`` for it to land."""
        with self._lock:
            batch, self._batch = self._batch, None
            self._open = {}
            if batch is not None and len(batch):
                if self.inline:
                    self._run(batch)
                    return
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix=f"bank-queue-{getattr(self.bank, 'name', '')}")
                    weakref.finalize(self, self._executor.shutdown, wait=False)
                # the worker thread runs each send in the caller's context: a trainer task's calls then find
                # their Dask worker (distributed keeps it in a context variable) as they would in the task
                self._jobs.append(self._executor.submit(contextvars.copy_context().run, self._run, batch))
            while self._jobs and self._jobs[0].done():
                self._jobs.popleft()
            last = self._jobs[-1] if self._jobs else None
        if wait and last is not None:
            try:
                last.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                raise DeadlineExceeded(f"bank {self.bank.name!r}: the layers' calls did not finish within "
                                       f"{timeout:g}s; expected the bank to answer") from None
            except Exception:  # each operation's future carries its error; the layers raise it where it belongs
                logger.debug("bank %s: a send of the layers' calls failed", self.bank.name, exc_info=True)

    def _run(self, batch: Any) -> None:
        with self.bank.sending_for_queue():
            batch.send()

    def drain(self) -> None:
        """Send what is held and wait until everything sent has landed (errors stay on their futures)."""
        self.send(wait=True, timeout=4.0 * float(getattr(self.bank, "timeout", 60.0)))

    def raise_failed(self) -> None:
        """Raise the error of the oldest push that failed (once), and forget pushes no held read needs.

        A push lands in order, so only the oldest pushes of a table are done: the scan of a table stops at
        the first push still in flight.
        """
        with self._lock:
            for table, pushes in self._pushes.items():
                for p in pushes:
                    if not p.future.done():
                        break
                    if p.future.exception() is not None:  # it never landed, so no read missed it
                        pushes.remove(p)
                        exc = p.future.exception()
                        assert exc is not None
                        raise exc
                if not pushes or not pushes[0].future.done():
                    continue
                oldest = min((r.oldest_after() for r in self._readers.get(table, ())), default=self._seq.get(table, 0))
                while pushes and pushes[0].future.done() and pushes[0].seq < oldest:
                    pushes.popleft()

    def stop(self) -> None:
        """Stop the worker thread (the bank calls it when it closes, after a last :meth:`drain`)."""
        with self._lock:
            ex, self._executor = self._executor, None
            self._batch = None
            self._open = {}
        if ex is not None:
            ex.shutdown(wait=True)


@dataclasses.dataclass
class _Read:
    """A read held or in flight: its keys, whether it inserts, the pushes it includes and its answer.

    ``missed`` counts, per key, updates missed before the pipeline knew of the read (a read carried
    over from a checkpoint). ``rows`` holds rows already answered (a read carried over).
    """

    keys: np.ndarray
    insert: bool
    after: int
    future: concurrent.futures.Future[Any] | None
    missed: np.ndarray | None = None
    rows: np.ndarray | None = None
    prefetched: bool = True
    counts: np.ndarray | None = None

    def matches(self, keys: np.ndarray, insert: bool, counts: np.ndarray | None) -> bool:
        """Whether this read serves a forward of ``keys`` (the same keys, ``insert`` and, inserting, counts)."""
        if self.insert != insert or self.keys.shape != keys.shape or not np.array_equal(self.keys, keys):
            return False
        if not insert or (self.counts is None and counts is None):
            return True
        mine = np.ones(keys.shape[0], np.int64) if self.counts is None else self.counts
        theirs = np.ones(keys.shape[0], np.int64) if counts is None else counts
        return bool(np.array_equal(mine, theirs))


class RowPipeline:
    """One layer's reads and gradient pushes through its bank's :class:`BankQueue`, with staleness counted.

    Parameters
    ----------
    column
        The bank column read and trained.
    staleness
        Most updates of its own a served row may have missed (0: exact order).
    asynchronous
        Send in the background when a forward is served from a prefetch (ignored for in-process shards,
        which run every call inline).
    timeout
        Seconds one wait for a read or a push may take (default four times the bank's call timeout).
    """

    def __init__(self, column: BankColumn, *, staleness: int = 1, asynchronous: bool = True,
                 timeout: float | None = None) -> None:
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(f"{column.owner}: staleness={staleness!r}; expected an int >= 0 (0: exact order)")
        self.column = column
        self.staleness = int(staleness)
        self.asynchronous = bool(asynchronous)
        self.timeout = float(timeout) if timeout is not None else 4.0 * float(getattr(column.bank, "timeout", 60.0))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._reads: collections.deque[_Read] = collections.deque()
        self._distinct: collections.deque[tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]] = \
            collections.deque(maxlen=MAX_PREFETCHES)
        self._queue: BankQueue | None = None
        self.stats = PipelineStats()

    @property
    def queue(self) -> BankQueue:
        """The bank's queue in this process."""
        if self._queue is None:
            self._queue = BankQueue.of(self.column.bank)
            self._queue._readers.setdefault(self.table, weakref.WeakSet()).add(self)
        return self._queue

    # -- pickling: a copy starts with nothing in flight -----------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"column": self.column, "staleness": self.staleness, "asynchronous": self.asynchronous,
                "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    @property
    def table(self) -> str:
        return self.column.table

    def oldest_after(self) -> int:
        """The oldest push count a held read started after (pushes to the table before it are not needed)."""
        if not self._reads:
            return 1 << 62
        return min(r.after for r in self._reads)

    def _result(self, fut: concurrent.futures.Future[Any], what: str) -> Any:
        try:
            return fut.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise DeadlineExceeded(f"{self.column.owner}: {what} did not finish within {self.timeout:g}s "
                                   f"(table {self.table!r}); expected the bank to answer") from None

    # -- reads ---------------------------------------------------------------------------------------------
    def distinct(self, keys: np.ndarray, *, keep: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct ``keys`` in order of first occurrence, where each key is among them and how often each
        occurs (the bank's compiled hash pass). ``keep`` remembers the answer for the forward that will
        ask for the same keys (a prefetch's), so it is computed once."""
        for i, (k, got) in enumerate(self._distinct):
            if k.shape == keys.shape and np.array_equal(k, keys):
                del self._distinct[i]
                return got
        pos, inverse, counts = dedupe(keys)
        got = (keys[pos], inverse, counts)
        if keep:
            self._distinct.append((keys, got))
        return got

    def prefetch(self, keys: np.ndarray, insert: bool, counts: np.ndarray | None = None) -> None:
        """Hold a read of the rows of ``keys`` (behind every push asked for so far); it travels with the next send.

        ``counts``: with insert, what each key adds to its frequency (default one).
        """
        q = self.queue
        q.raise_failed()
        while len(self._reads) >= MAX_PREFETCHES:  # unmatched prefetches: the oldest goes
            self._reads.popleft()
            self.stats.discarded += 1
        after, fut = q.read(self.table, self.column.column, keys, insert, counts)
        self._reads.append(_Read(keys, bool(insert), after, fut, counts=counts))

    def begin_read(self, keys: np.ndarray, insert: bool, counts: np.ndarray | None = None) -> _Read:
        """The read a forward of ``keys`` will use: a matching prefetch, else a read held now (not sent yet).

        A prefetch matches when it asked for the same keys with the same ``insert`` (and, inserting, the same
        ``counts``); prefetches held before it are discarded. :meth:`end_read` sends and waits.
        """
        q = self.queue
        q.raise_failed()
        at = next((i for i, r in enumerate(self._reads) if r.matches(keys, bool(insert), counts)), None)
        if at is not None:  # prefetches held before the match were never used
            for _ in range(at):
                self._reads.popleft()
                self.stats.discarded += 1
            return self._reads.popleft()
        after, fut = q.read(self.table, self.column.column, keys, insert, counts)
        return _Read(keys, bool(insert), after, fut, prefetched=False, counts=counts)

    def end_read(self, r: _Read) -> np.ndarray:
        """Send what the queue holds (in the background when ``r`` was prefetched and the layer is asynchronous),
        then the rows of ``r``; rows that missed more than ``staleness`` updates are read again behind them."""
        t0 = time.perf_counter()
        q = self.queue
        q.send(wait=not (r.prefetched and self.asynchronous), timeout=self.timeout)
        if r.rows is not None:
            rows = r.rows
        else:
            assert r.future is not None
            rows = self.column.rows_of(self._result(r.future, "a prefetched read" if r.prefetched else "a read"),
                                       r.keys, r.insert)
        missed = q.missed(self.table, r.keys, r.after)
        if r.missed is not None:
            missed += r.missed
        q.raise_failed()  # a push that travelled with this read (or before it) and failed fails this forward
        if r.prefetched:
            self.stats.prefetched += 1
            over = missed > self.staleness
            if over.any():
                rows = self._refetch(rows, r.keys, over, missed)
        self.stats.reads += 1
        self.stats.rows += int(r.keys.shape[0])
        self.stats.stale_rows += int(np.count_nonzero(missed))
        if missed.size:
            self.stats.max_staleness = max(self.stats.max_staleness, int(missed.max()))
        self.stats.wait_s += time.perf_counter() - t0
        return rows

    def read(self, keys: np.ndarray, insert: bool) -> np.ndarray:
        """Rows of ``keys`` for a forward (see :meth:`begin_read` and :meth:`end_read`)."""
        return self.end_read(self.begin_read(keys, insert))

    def _refetch(self, rows: np.ndarray, keys: np.ndarray, over: np.ndarray, missed: np.ndarray) -> np.ndarray:
        """Read the rows over the bound again behind every push so far (sent with what the queue holds)."""
        t0 = time.perf_counter()
        q = self.queue
        _, fut = q.read(self.table, self.column.column, keys[over], False)
        q.send(wait=False, timeout=self.timeout)
        fresh = self.column.rows_of(self._result(fut, "a re-read of stale rows"), keys[over], False)
        self.stats.push_wait_s += time.perf_counter() - t0
        rows = rows.copy() if not rows.flags.writeable else rows
        rows[over] = fresh
        missed[over] = 0
        self.stats.refetched_rows += int(np.count_nonzero(over))
        return rows

    # -- gradients -----------------------------------------------------------------------------------------
    def push(self, keys: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> None:
        """Hold a gradient push of unique ``keys``; it travels with the next send of the bank's queue.

        Its provenance is the bank object's writer (:meth:`KnowledgeBank.set_writer
        <carls_dask.bank.client.KnowledgeBank.set_writer>`: the trainer's name and step in a run).
        """
        t0 = time.perf_counter()
        self.queue.push(self.table, self.column.column, keys, grads, learning_rate)
        self.stats.pushes += 1
        self.stats.push_s += time.perf_counter() - t0

    def flush(self) -> None:
        """Send what the queue holds and wait until it has landed; raises the error of a push that failed (once)."""
        t0 = time.perf_counter()
        q = self.queue
        q.send(wait=True, timeout=self.timeout)
        self.stats.push_wait_s += time.perf_counter() - t0
        q.raise_failed()

    def export_prefetches(self) -> list[dict[str, Any]]:
        """The prefetched reads not used yet, answered (sends and waits), with the updates each row missed so far.

        A trainer's checkpoint keeps them, so that a run resumed from it serves the next forward the rows an
        uninterrupted run serves (rows read before the last step's push, not after it).
        """
        q = self.queue
        q.send(wait=True, timeout=self.timeout)
        out = []
        for r in self._reads:
            if r.rows is not None:
                rows = r.rows
            else:
                assert r.future is not None
                rows = self.column.rows_of(self._result(r.future, "a prefetched read"), r.keys, r.insert)
            missed = q.missed(self.table, r.keys, r.after) + (0 if r.missed is None else r.missed)
            out.append({"keys": r.keys, "insert": r.insert, "rows": np.array(rows), "missed": missed,
                        "counts": r.counts})
        return out

    def import_prefetches(self, reads: list[dict[str, Any]]) -> None:
        """Hold reads from :meth:`export_prefetches` as answered prefetches."""
        after = self.queue.after(self.table)
        for r in reads:
            counts = r.get("counts")
            self._reads.append(_Read(np.asarray(r["keys"], dtype=np.int64), bool(r["insert"]), after, None,
                                     np.asarray(r["missed"], dtype=np.int64), rows=np.asarray(r["rows"]),
                                     counts=None if counts is None else np.asarray(counts, dtype=np.int64)))

    def pending(self) -> int:
        """Pushes to the layer's table asked for that have not landed yet."""
        return self.queue.pending(self.table)

    def close(self) -> None:
        """:meth:`flush` (the bank's queue and its thread stay for the other layers; the bank stops them)."""
        self.flush()

    def reset_stats(self) -> PipelineStats:
        """Return the counters so far and start new ones."""
        out, self.stats = self.stats, PipelineStats()
        return out
