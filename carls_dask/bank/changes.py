"""Change feeds: which keys of a watched column moved by more than a threshold since a consumer's cursor.

A table declares the columns it watches in :attr:`TableSpec.watch <carls_dask.bank.schema.TableSpec.watch>`
(:class:`ChangeWatch`: a column, a distance ``l2`` or ``cosine`` and a threshold). Each shard keeps, per
watched column, two arrays beside the table's rows and nothing per key in Python:

- ``moved_at`` (``int64[rows]``): the feed's sequence number at the write that last *moved* the row;
- ``reference`` (the column's dtype and shape): the row's value at that write.

A write compares each written row with its reference; a row whose distance exceeds the threshold (or a
new row) gets the feed's next sequence number and its value becomes the new reference. Comparing with the
reference, not with the previous write, means slow drift adds up: many small steps count once their sum
passes the threshold. A consumer holds a :class:`ChangeCursor` (per shard: the shard's feed epoch and the
sequence number it has seen) and asks for the rows with a larger ``moved_at``. The epoch is new whenever a
shard's state is built anew (a restore, a re-homed shard): a cursor of an older epoch gets every row of
that shard once, so a restart or a move can repeat keys but never lose one.

The memory cost is one ``int64`` and one copy of the watched column per row.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from carls_dask.errors import ConfigError

__all__ = ["CHANGE_METRICS", "ChangeBatch", "ChangeCursor", "ChangeFeed", "ChangeWatch"]

#: Distances a change feed measures a row's move with.
CHANGE_METRICS = ("l2", "cosine")


@dataclass(frozen=True)
class ChangeWatch:
    """A watched column of a table: rows whose value moves by more than ``threshold`` are reported.

    Parameters
    ----------
    column
        A float column of the table.
    metric
        ``"l2"`` (Euclidean distance between the row and its reference value) or ``"cosine"``
        (one minus their cosine similarity; a zero row counts as distance 1 from a non-zero one).
    threshold
        Least distance that counts as a move (``0`` reports every write that changes the value).
    """

    column: str
    metric: str = "l2"
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError(f"ChangeWatch column must be a non-empty string, got {self.column!r}")
        if self.metric not in CHANGE_METRICS:
            raise ConfigError(f"ChangeWatch {self.column!r}: metric {self.metric!r} is not one of {CHANGE_METRICS}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float | np.floating | np.integer) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"ChangeWatch {self.column!r}: threshold must be a finite number >= 0, got {t!r}")
        object.__setattr__(self, "threshold", float(t))

    def to_json(self) -> dict[str, object]:
        """A JSON-able description (inverse of :meth:`from_json`)."""
        return {"column": self.column, "metric": self.metric, "threshold": self.threshold}

    @classmethod
    def from_json(cls, data: object) -> ChangeWatch:
        """Build a watch from :meth:`to_json` output (or a bare column name)."""
        if isinstance(data, str):
            return cls(data)
        if isinstance(data, ChangeWatch):
            return data
        if not isinstance(data, dict):
            raise ConfigError(f"ChangeWatch: expected a column name or a mapping, got {data!r}")
        return cls(str(data["column"]), str(data.get("metric", "l2")), data.get("threshold", 0.0))


@dataclass(frozen=True)
class ChangeCursor:
    """Where a consumer of a change feed stands: what it has seen of each shard.

    Attributes
    ----------
    bank
        Lineage of the bank the cursor belongs to (kept by a restore, so cursors stay valid across it).
    table, column
        The watched column.
    shards
        Per shard: ``(epoch, sequence number seen)``.
    """

    bank: str
    table: str
    column: str
    shards: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ChangeBatch:
    """An answer of :meth:`KnowledgeBank.changes <carls_dask.bank.client.KnowledgeBank.changes>`.

    Attributes
    ----------
    keys
        ``int64[n]``: the present keys whose value moved since the cursor (each once, in no set order).
    cursor
        The cursor to pass next time (it has seen these keys).
    complete
        False when ``limit`` cut the answer: ask again with :attr:`cursor` for the rest.
    """

    keys: np.ndarray
    cursor: ChangeCursor
    complete: bool = True


def _distance(metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row distance between ``a`` and ``b`` (``[n, ...]``) under ``metric``."""
    x = a.reshape(a.shape[0], -1).astype(np.float64, copy=False)
    y = b.reshape(b.shape[0], -1).astype(np.float64, copy=False)
    if metric == "l2":
        d: np.ndarray = np.sqrt(np.square(x - y).sum(axis=1))
        return d
    nx = np.sqrt(np.square(x).sum(axis=1))
    ny = np.sqrt(np.square(y).sum(axis=1))
    denom = nx * ny
    cos = np.divide((x * y).sum(axis=1), denom, out=np.zeros(x.shape[0]), where=denom > 0)
    cos[(nx == 0) & (ny == 0)] = 1.0  # two zero rows: no move
    out: np.ndarray = 1.0 - cos
    return out


class ChangeFeed:
    """The change feed of one watched column of one shard's table (see the module docstring).

    Parameters
    ----------
    watch
        What is watched and how a move is measured.
    row_shape, dtype
        Shape and dtype of one row of the column.
    """

    def __init__(self, watch: ChangeWatch, row_shape: Sequence[int], dtype: np.dtype) -> None:
        self.watch = watch
        self.row_shape = tuple(int(s) for s in row_shape)
        self.moved_at = np.zeros(0, dtype=np.int64)
        self.reference = np.zeros((0, *self.row_shape), dtype=dtype)
        #: Sequence number of the newest move (0: none yet).
        self.seq = 0
        #: Rows compared and rows that moved, since the feed began (for rates).
        self.compared = 0
        self.moves = 0

    def _grow(self, needed: int) -> None:
        if needed <= self.moved_at.shape[0]:
            return
        size = max(needed, 2 * self.moved_at.shape[0], 1024)
        moved = np.zeros(size, dtype=np.int64)
        moved[: self.moved_at.shape[0]] = self.moved_at
        ref = np.zeros((size, *self.row_shape), dtype=self.reference.dtype)
        ref[: self.reference.shape[0]] = self.reference
        self.moved_at, self.reference = moved, ref

    def written(self, rows: np.ndarray, values: np.ndarray) -> int:
        """Rows ``rows`` (unique) now hold ``values``; returns how many moved (a row never seen before always does)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return 0
        self._grow(int(rows.max()) + 1)
        dist = _distance(self.watch.metric, values, self.reference[rows])
        moved = (dist > self.watch.threshold) | (self.moved_at[rows] == 0)
        self.compared += int(rows.size)
        if not moved.any():
            return 0
        self.seq += 1
        hit = rows[moved]
        self.moved_at[hit] = self.seq
        self.reference[hit] = values[moved]
        self.moves += int(hit.size)
        return int(hit.size)

    def moved(self, holes: np.ndarray, movers: np.ndarray, n: int) -> None:
        """Rows ``movers`` were copied into ``holes`` (a delete) and the table now has ``n`` rows."""
        if movers.size:
            self._grow(int(max(movers.max(), holes.max())) + 1)
            self.moved_at[holes] = self.moved_at[movers]
            self.reference[holes] = self.reference[movers]
        self.moved_at[n:] = 0

    def rows_since(self, seq: int | None, n: int, limit: int | None = None) -> tuple[np.ndarray, int, bool]:
        """Rows (< ``n``) that moved after sequence number ``seq`` (all rows when ``None``).

        Returns the rows, the sequence number the answer is complete up to, and whether it is complete
        (``limit`` keeps whole sequence numbers: at least the first one, then as many as fit).
        """
        if seq is None:
            return np.arange(n, dtype=np.int64), self.seq, True
        at = self.moved_at[:n]
        rows = np.flatnonzero(at > seq)
        if limit is None or rows.size <= limit:
            return rows, self.seq, True
        seqs = np.sort(at[rows])
        cut = int(seqs[max(int(limit), 1) - 1])
        if np.count_nonzero(seqs <= cut) > limit:  # the cut's sequence number does not fit whole
            smaller = seqs[seqs < cut]
            cut = int(smaller[-1]) if smaller.size else cut  # the first one is kept whole however big
        keep = rows[at[rows] <= cut]
        complete = keep.size == rows.size
        return keep, (self.seq if complete else cut), complete


def new_epoch() -> str:
    """A fresh feed epoch (a shard's feeds start one when its state is built)."""
    return uuid.uuid4().hex[:12]
