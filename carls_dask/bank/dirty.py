"""Which rows of a table changed, and which keys were deleted, since the last committed snapshot.

An incremental snapshot writes only what :class:`DirtyRows` says changed. The marks are one ``bool``
per row in a contiguous array (a write marks its rows: cheap next to the write itself) plus the keys of
deleted rows, kept as keys because a delete moves rows (the row that fills a hole carries its mark with it,
see :meth:`DirtyRows.moved`). A key deleted and then inserted again has a marked row, so it is an upsert;
:meth:`ShardCore.export_changes <carls_dask.bank.core.ShardCore.export_changes>` drops present keys from the
deleted set.

The marks live in two generations so that a failed snapshot loses nothing:

- :meth:`DirtyRows.freeze` moves the current marks to *pending* (what the snapshot being written holds)
  and starts empty current marks (changes made while the snapshot is written or before it commits);
- :meth:`DirtyRows.commit` drops the pending marks once the snapshot is committed;
- :meth:`DirtyRows.rollback` folds them back into the current ones when it was not.

Row moves apply to both generations, so pending marks stay right while a commit is awaited.
"""

from __future__ import annotations

import logging

import numpy as np

from carls_dask.errors import LifecycleError

__all__ = ["DirtyRows"]

logger = logging.getLogger(__name__)


def _grown(marks: np.ndarray, needed: int) -> np.ndarray:
    if needed <= marks.shape[0]:
        return marks
    out = np.zeros(max(needed, 2 * marks.shape[0], 1024), dtype=bool)
    out[: marks.shape[0]] = marks
    return out


class DirtyRows:
    """Change marks of one table of one shard (see the module docstring).

    Attributes
    ----------
    marks : numpy.ndarray
        ``bool[>= rows]``: rows written since the marks were last frozen.
    pending : numpy.ndarray or None
        The frozen marks of the snapshot being written (None when none is).
    """

    def __init__(self) -> None:
        self.marks = np.zeros(0, dtype=bool)
        self._deleted: list[np.ndarray] = []
        self.pending: np.ndarray | None = None
        self._pending_deleted: list[np.ndarray] = []

    # -- hooks of the shard core --------------------------------------------------------------------
    def mark(self, rows: np.ndarray | slice) -> None:
        """Mark ``rows`` (an int array or a ``slice`` with a stop) as changed."""
        if isinstance(rows, slice):
            self.marks = _grown(self.marks, int(rows.stop))
        else:
            if rows.size == 0:
                return
            self.marks = _grown(self.marks, int(rows.max()) + 1)
        self.marks[rows] = True

    def marks_for(self, n: int) -> np.ndarray:
        """The current marks grown to at least ``n`` rows (for a compiled pass that marks the rows it writes)."""
        self.marks = _grown(self.marks, int(n))
        return self.marks

    def deleted(self, keys: np.ndarray) -> None:
        """Record the keys of rows about to be deleted (before their rows are reused)."""
        if keys.size:
            self._deleted.append(np.array(keys, dtype=np.int64, copy=True))

    def moved(self, holes: np.ndarray, movers: np.ndarray, n: int) -> None:
        """Rows ``movers`` were copied into ``holes`` and the table now has ``n`` rows."""
        for name in ("marks", "pending"):
            arr = getattr(self, name)
            if arr is None:
                continue
            if movers.size:
                arr = _grown(arr, int(max(movers.max(), holes.max())) + 1)
                arr[holes] = arr[movers]
            arr[n:] = False
            setattr(self, name, arr)

    # -- what changed -------------------------------------------------------------------------------
    def count(self, n: int) -> int:
        """Rows among the first ``n`` marked in the current generation."""
        return int(np.count_nonzero(self.marks[:n]))

    def frozen_rows(self, n: int) -> np.ndarray:
        """Row numbers (< ``n``) of the pending marks (empty when nothing is frozen)."""
        if self.pending is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.pending[:n])

    def frozen_deleted(self) -> np.ndarray:
        """Unique keys deleted in the pending generation."""
        if not self._pending_deleted:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(self._pending_deleted))

    # -- generations --------------------------------------------------------------------------------
    @property
    def frozen(self) -> bool:
        """Whether a snapshot's marks are pending."""
        return self.pending is not None

    def freeze(self) -> None:
        """Move the current marks to pending (a snapshot starts); refuses while others are pending."""
        if self.pending is not None:
            raise LifecycleError("change marks: a snapshot's marks are still pending; commit or roll them back first")
        self.pending = self.marks
        self._pending_deleted = self._deleted
        self.marks = np.zeros(self.pending.shape[0], dtype=bool)
        self._deleted = []

    def commit(self) -> None:
        """The pending snapshot is committed: forget its marks."""
        self.pending = None
        self._pending_deleted = []

    def rollback(self) -> None:
        """The pending snapshot was not committed: its marks are current again."""
        if self.pending is None:
            return
        self.marks = _grown(self.marks, self.pending.shape[0])
        self.marks[: self.pending.shape[0]] |= self.pending
        self._deleted = [*self._pending_deleted, *self._deleted]
        self.pending = None
        self._pending_deleted = []
