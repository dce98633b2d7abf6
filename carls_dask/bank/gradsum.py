"""Summing the gradients of duplicate keys of a batch by row, in one compiled pass (no sort).

The rows found by the key index are small non-negative ints, so duplicates are grouped by row in an
open-addressing table of twice the batch size. Each row's sum starts from its first occurrence and
adds the later ones in batch order, in the gradients' dtype: the same numbers as adding them one
occurrence at a time. Without numba a stable sort by row gives the same sums.

:func:`group_by_row` gives the grouping alone (each row's first occurrence and a chain to the next), for
a compiled optimizer step that adds a row's gradients where it reads them (:mod:`carls_dask.bank.rowstep`)
instead of from a summed copy of the batch.
"""

from __future__ import annotations

import numpy as np

from carls_dask.bank.jit import numba

__all__ = ["group_by_row", "sum_by_row"]

if numba is not None:

    @numba.njit(cache=True, nogil=True)
    def _group_compiled(rows, urows, first, nxt):
        n = rows.shape[0]
        size = 16
        bits = 4
        while size < 2 * n:
            size *= 2
            bits += 1
        mask = size - 1
        shift = np.uint64(64 - bits)
        slots = np.full(size, -1, dtype=np.int64)
        last = np.empty(n, dtype=np.int64)  # the latest occurrence of each distinct row so far
        u = 0
        for i in range(n):
            r = rows[i]
            nxt[i] = -1
            pos = np.int64((np.uint64(r) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
            while True:
                at = slots[pos]
                if at < 0:
                    slots[pos] = u
                    urows[u] = r
                    first[u] = i
                    last[u] = i
                    u += 1
                    break
                if urows[at] == r:
                    nxt[last[at]] = i
                    last[at] = i
                    break
                pos = (pos + 1) & mask
        return u

    @numba.njit(cache=True, nogil=True)
    def _sum_compiled(rows, grads, urows, summed):
        n = rows.shape[0]
        w = grads.shape[1]
        size = 16
        bits = 4
        while size < 2 * n:
            size *= 2
            bits += 1
        mask = size - 1
        shift = np.uint64(64 - bits)
        slots = np.full(size, -1, dtype=np.int64)
        u = 0
        for i in range(n):
            r = rows[i]
            pos = np.int64((np.uint64(r) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
            while True:
                at = slots[pos]
                if at < 0:
                    slots[pos] = u
                    urows[u] = r
                    for j in range(w):
                        summed[u, j] = grads[i, j]
                    u += 1
                    break
                if urows[at] == r:
                    for j in range(w):
                        summed[at, j] += grads[i, j]
                    break
                pos = (pos + 1) & mask
        return u


def group_by_row(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The distinct rows of a batch (in order of first occurrence), each one's first position, and for every
    position the next one of the same row (-1 after the last); None without numba.

    A row's gradients are those at ``first[u]``, ``nxt[first[u]]``, ``nxt[nxt[first[u]]]``, ... in batch order.
    """
    if numba is None:
        return None
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    n = rows.shape[0]
    urows = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    u = int(_group_compiled(rows, urows, first, nxt))
    return urows[:u].copy(), first[:u].copy(), nxt


def sum_by_row(rows: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows (in order of first occurrence) and their summed gradients.

    Parameters
    ----------
    rows
        ``int64[n]`` non-negative rows, duplicates allowed.
    grads
        ``[n, ...]`` gradients (float).

    Returns
    -------
    tuple
        ``urows`` (``int64[u]``) and ``summed`` (``[u, ...]``, the gradients' dtype).
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    n = rows.shape[0]
    shape = grads.shape[1:]
    if numba is not None and n:
        g = np.ascontiguousarray(grads).reshape(n, -1)
        urows = np.empty(n, dtype=np.int64)
        summed = np.empty_like(g)
        u = int(_sum_compiled(rows, g, urows, summed))
        return urows[:u].copy(), summed[:u].reshape((u, *shape))
    order = np.argsort(rows, kind="stable")
    sr = rows[order]
    first = np.ones(n, dtype=bool)
    np.not_equal(sr[1:], sr[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    summed = np.take(grads, order[starts], axis=0)
    group = np.cumsum(first) - 1
    rank = np.arange(n) - starts[group]
    for level in range(1, int(rank.max(initial=0)) + 1):
        sel = rank == level
        summed[group[sel]] += np.take(grads, order[sel], axis=0)
    # first-occurrence order, as the compiled pass gives
    by_first = np.argsort(order[starts], kind="stable")
    return sr[starts][by_first], summed[by_first]
