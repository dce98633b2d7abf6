"""Read-only views of the first ``n`` rows of a table's storage, for writing a snapshot chunk by chunk.

A snapshot writer reads the live rows of a shard without copying them whole
(:meth:`ShardCore.state_view <carls_dask.bank.core.ShardCore.state_view>`): contiguous numpy storage is
handed over as a view ``a[:n]``; other storage (fixed-size segments, whose ``a[i:j]`` is a copy) is
wrapped in :class:`RowView`, which exposes only what the writer uses: ``shape``, ``dtype``, ``len``,
``v[i:j]`` (a copy of those rows), ``v[int_array]`` (a gathered copy) and ``v.take(rows, out)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carls_dask.errors import InvalidArgumentError, RowIndexError

__all__ = ["RowView", "live_rows"]


class RowView:
    """The first ``n`` rows of a row store that supports ``a[i:j]`` and ``a[int_array]`` (copies).

    Parameters
    ----------
    store
        The row store (``.shape``, ``.dtype``, ``a[i:j]``, ``a[rows]``, optionally ``a.take(rows, out=)``).
    n
        Live rows.
    """

    def __init__(self, store: Any, n: int) -> None:
        if int(n) > int(store.shape[0]):
            raise InvalidArgumentError(f"row view: {n} rows asked of a store of {store.shape[0]}; expected at most that many")
        self.store = store
        self.n = int(n)
        self.dtype = np.dtype(store.dtype)
        self.shape = (self.n, *tuple(store.shape[1:]))
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, sel: Any) -> np.ndarray:
        if isinstance(sel, slice):
            start, stop, step = sel.indices(self.n)
            if step != 1:
                raise InvalidArgumentError(f"row view: slice step {step}; expected 1")
            return np.asarray(self.store[start:stop])
        rows = np.asarray(sel)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n):
            raise RowIndexError(f"row view: rows in [{rows.min()}, {rows.max()}]; expected [0, {self.n})")
        return np.asarray(self.store[rows])

    def take(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` gathered into ``out`` (a new array when None)."""
        got = self[rows]
        if out is None:
            return got
        out[...] = got
        return out


def live_rows(store: Any, n: int) -> np.ndarray | RowView:
    """The first ``n`` rows of ``store``: a numpy view when it is a numpy array, else a :class:`RowView`."""
    if isinstance(store, np.ndarray):
        return store[:n]
    return RowView(store, n)
