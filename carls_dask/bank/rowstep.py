"""The optimizer step applied in place to the rows of a batch, as compiled loops over segmented storage.

:func:`~carls_dask.bank.optimizers.apply_optimizer` is the reference: it takes gathered copies of the
weights and slots, builds the new ones in a chain of NumPy temporaries, and the shard checks them and
scatters them back. :func:`plan_step` computes the same numbers (the same IEEE operations in the same
order and dtype, so the same bits) row by row where the rows live, in one visit per row: each row's weights
and slots are saved aside (one sequential buffer), overwritten with the new ones and checked. A step that
would make a weight non-finite changes nothing: the saved rows are written back (:meth:`StepPlan.run`
answers False), and :meth:`StepPlan.undo` takes back a step whose batch failed in another column.

It covers SGD, Adagrad and Adam on float32 and float64 columns whose slots exist; anything else (a float16
column, slots not yet allocated, no numba) goes through the reference path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from carls_dask.bank.jit import numba
from carls_dask.bank.optimizers import STEP_SLOT, compute_dtype
from carls_dask.bank.segments import SegmentedArray

__all__ = ["StepPlan", "plan_step"]

TypedList: Any = None
if numba is not None:
    from numba.typed import List as TypedList  # type: ignore[no-redef]

    @numba.njit(cache=True, nogil=True)
    def _by_segment(rows, shift):
        # positions of the rows grouped by segment (a stable counting sort), so that each segment is fetched once
        n = rows.shape[0]
        top = 0
        for i in range(n):
            top = max(top, rows[i] >> shift)
        counts = np.zeros(top + 2, dtype=np.int64)
        for i in range(n):
            counts[(rows[i] >> shift) + 1] += 1
        for s in range(top + 1):
            counts[s + 1] += counts[s]
        order = np.empty(n, dtype=np.int64)
        for i in range(n):
            s = rows[i] >> shift
            order[counts[s]] = i
            counts[s] += 1
        return order

    # error_model="numpy": IEEE division (no zero-division branch). Each kernel visits every row once: the new
    # weights and slots are computed into row buffers of its own (a loop that vectorises: nothing it writes can
    # alias what it reads), the row's old values are saved to ``save`` (row p of the visit order), the new ones
    # written and checked; at the first non-finite weight the saved rows are written back and the kernel
    # answers how many rows it visited. ``_restore`` undoes a whole visit.

    @numba.njit(cache=True, nogil=True)
    def _restore(arrays, shift, mask, rows, order, upto, save):
        w = save.shape[1] // len(arrays)
        for p in range(upto):
            r = rows[order[p]]
            s = r >> shift
            o = r & mask
            for k in range(len(arrays)):
                seg = arrays[k][s]
                for j in range(w):
                    seg[o, j] = save[p, k * w + j]

    @numba.njit(cache=True, nogil=True, inline="always")
    def _grad(g, first, nxt, i, out):
        # row i's gradient: its first occurrence plus the later ones, added in batch order
        q = first[i]
        for j in range(out.shape[0]):
            out[j] = g[q, j]
        q = nxt[q]
        while q >= 0:
            for j in range(out.shape[0]):
                out[j] += g[q, j]
            q = nxt[q]

    @numba.njit(cache=True, nogil=True, inline="always")
    def _finite(row):
        ok = True
        for j in range(row.shape[0]):
            x = row[j]
            ok = ok and (x - x == 0)  # NaN and +-Inf give NaN
        return ok

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _sgd(ws, shift, mask, rows, order, g, first, nxt, lr, save):
        w = g.shape[1]
        new_w = np.empty(w, dtype=g.dtype)
        grow = np.empty(w, dtype=g.dtype)
        cur = -1
        wseg = ws[0]
        for p in range(order.shape[0]):
            i = order[p]
            r = rows[i]
            s = r >> shift
            if s != cur:  # the rows come grouped by segment: fetch each segment once
                wseg = ws[s]
                cur = s
            wrow = wseg[r & mask]
            _grad(g, first, nxt, i, grow)
            for j in range(w):
                new_w[j] = wrow[j] - lr * grow[j]
            for j in range(w):
                save[p, j] = wrow[j]
                wrow[j] = new_w[j]
            if not _finite(new_w):
                return p + 1
        return -1

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _adagrad(ws, accs, shift, mask, rows, order, g, first, nxt, lr, tiny, save):
        w = g.shape[1]
        new_w = np.empty(w, dtype=g.dtype)
        new_a = np.empty(w, dtype=g.dtype)
        grow = np.empty(w, dtype=g.dtype)
        cur = -1
        wseg = ws[0]
        aseg = accs[0]
        for p in range(order.shape[0]):
            i = order[p]
            r = rows[i]
            s = r >> shift
            if s != cur:
                wseg = ws[s]
                aseg = accs[s]
                cur = s
            o = r & mask
            wrow = wseg[o]
            arow = aseg[o]
            _grad(g, first, nxt, i, grow)
            for j in range(w):
                gi = grow[j]
                acc = arow[j] + gi * gi
                step = np.sqrt(acc)
                step = tiny if step < tiny else step  # np.maximum: NaN stays NaN
                new_a[j] = acc
                new_w[j] = wrow[j] - (gi / step) * lr
            for j in range(w):
                save[p, j] = wrow[j]
                save[p, w + j] = arow[j]
                wrow[j] = new_w[j]
                arow[j] = new_a[j]
            if not _finite(new_w):
                return p + 1
        return -1

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _adam(ws, ms, vs, shift, mask, rows, order, g, first, nxt, lr_t, b1, c1, b2, c2, eps, save):
        w = g.shape[1]
        new_w = np.empty(w, dtype=g.dtype)
        new_m = np.empty(w, dtype=g.dtype)
        new_v = np.empty(w, dtype=g.dtype)
        grow = np.empty(w, dtype=g.dtype)
        cur = -1
        wseg = ws[0]
        mseg = ms[0]
        vseg = vs[0]
        for p in range(order.shape[0]):
            i = order[p]
            r = rows[i]
            s = r >> shift
            if s != cur:
                wseg = ws[s]
                mseg = ms[s]
                vseg = vs[s]
                cur = s
            o = r & mask
            wrow = wseg[o]
            mrow = mseg[o]
            vrow = vseg[o]
            _grad(g, first, nxt, i, grow)
            lr = lr_t[i]
            for j in range(w):
                gi = grow[j]
                m = b1 * mrow[j] + c1 * gi
                v = b2 * vrow[j] + c2 * gi * gi
                new_m[j] = m
                new_v[j] = v
                new_w[j] = wrow[j] - lr * m / (np.sqrt(v) + eps)
            for j in range(w):
                save[p, j] = wrow[j]
                save[p, w + j] = mrow[j]
                save[p, 2 * w + j] = vrow[j]
                wrow[j] = new_w[j]
                mrow[j] = new_m[j]
                vrow[j] = new_v[j]
            if not _finite(new_w):
                return p + 1
        return -1


def _compiled_for(weights: SegmentedArray, slots: Mapping[str, SegmentedArray], names: tuple[str, ...]) -> bool:
    if numba is None or weights.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return False
    if any(n not in slots for n in names):
        return False
    float_slots = [slots[n] for n in names if n != STEP_SLOT]
    return all(s.dtype == weights.dtype and s.segment_rows == weights.segment_rows for s in float_slots)


class StepPlan:
    """One column's compiled optimizer step: :meth:`run` applies it in place, :meth:`undo` takes it back."""

    def __init__(self, kernel: Any, args: tuple[Any, ...], arrays: list[SegmentedArray], rows: np.ndarray,
                 order: np.ndarray, empty: Callable[..., np.ndarray], steps: SegmentedArray | None = None) -> None:
        self._kernel = kernel
        self._args = args
        self._arrays = arrays
        self._rows = rows
        self._order = order
        self._steps = steps
        self._save = empty((rows.shape[0], arrays[0].width * len(arrays)), arrays[0].dtype)

    def _restore(self, upto: int) -> None:
        lists = TypedList()
        for a in self._arrays:
            lists.append(a.kernel_segments())
        first = self._arrays[0]
        _restore(lists, first.segment_shift, first.segment_rows - 1, self._rows, self._order, upto, self._save)

    def run(self) -> bool:
        """Apply the step to the rows in place; False (and every row as it was) when a new weight would not be
        finite."""
        failed = int(self._kernel(*self._args, self._save))
        if failed >= 0:
            self._restore(failed)
            return False
        if self._steps is not None:  # Adam's per-row step count, once every row went through
            self._steps[self._rows] = self._steps.take(self._rows) + 1
        return True

    def undo(self) -> None:
        """Take back a successful :meth:`run` (another column of the same batch failed)."""
        self._restore(self._rows.shape[0])
        if self._steps is not None:
            self._steps[self._rows] = self._steps.take(self._rows) - 1


def plan_step(
    optimizer: str,
    weights: SegmentedArray,
    slots: Mapping[str, SegmentedArray],
    rows: np.ndarray,
    grads: np.ndarray,
    *,
    learning_rate: float,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
    empty: Callable[..., np.ndarray] = np.empty,
    first: np.ndarray | None = None,
    nxt: np.ndarray | None = None,
) -> StepPlan | None:
    """One optimizer step on ``rows`` of ``weights`` and ``slots``, to check and then apply in place.

    Parameters
    ----------
    optimizer
        ``"sgd"``, ``"adagrad"`` or ``"adam"``.
    weights, slots
        The column's rows and its slot arrays (named as :func:`~carls_dask.bank.optimizers.initial_slots` names
        them).
    rows
        ``int64[m]`` distinct rows to update.
    grads
        ``[m, ...]`` gradients summed per row, of the column's compute dtype; or, with ``first`` and ``nxt``,
        the batch's gradients, row ``rows[u]`` taking those at ``first[u]``, ``nxt[first[u]]``, ... (see
        :func:`~carls_dask.bank.gradsum.group_by_row`) added in batch order.
    learning_rate, betas, epsilon
        As in :func:`~carls_dask.bank.optimizers.apply_optimizer`.
    empty
        ``empty(shape, dtype)``: where the saved rows go (e.g. a shard's
        :meth:`~carls_dask.bank.buffers.BufferPool.empty`).

    Returns
    -------
    StepPlan or None
        None when this column needs the reference path.
    """
    names = {"sgd": (), "adagrad": ("accumulator",), "adam": ("m", "v", STEP_SLOT)}.get(optimizer)
    if names is None or not _compiled_for(weights, slots, names):
        return None
    dt = compute_dtype(weights.dtype)
    m = rows.shape[0]
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    g = np.ascontiguousarray(grads, dtype=dt)
    g = g.reshape(g.shape[0], weights.width)
    if first is None or nxt is None:
        first, nxt = np.arange(m, dtype=np.int64), np.full(m, -1, dtype=np.int64)
    order = _by_segment(rows, weights.segment_shift)
    ws = weights.kernel_segments()
    shift, mask = weights.segment_shift, weights.segment_rows - 1
    lr = dt.type(learning_rate)
    if optimizer == "sgd":
        return StepPlan(_sgd, (ws, shift, mask, rows, order, g, first, nxt, lr), [weights], rows, order, empty)
    if optimizer == "adagrad":
        acc = slots["accumulator"]
        return StepPlan(_adagrad, (ws, acc.kernel_segments(), shift, mask, rows, order, g, first, nxt, lr,
                                   dt.type(np.finfo(dt).tiny)), [weights, acc], rows, order, empty)
    b1, b2, one = dt.type(betas[0]), dt.type(betas[1]), dt.type(1)
    st = slots[STEP_SLOT]
    # bias correction per row from the row's own step count, in float64 then rounded (as the reference)
    tf = (st.take(rows) + 1).astype(np.float64)
    corr = np.sqrt(1.0 - np.power(float(betas[1]), tf)) / (1.0 - np.power(float(betas[0]), tf))
    lr_t = np.ascontiguousarray((float(learning_rate) * corr).astype(dt))
    return StepPlan(_adam, (ws, slots["m"].kernel_segments(), slots["v"].kernel_segments(), shift, mask, rows, order,
                            g, first, nxt, lr_t, b1, one - b1, b2, one - b2, dt.type(epsilon)),
                    [weights, slots["m"], slots["v"]], rows, order, empty, steps=st)
