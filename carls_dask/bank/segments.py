"""Row storage in fixed-size segments: growing never copies old rows and allocates at most one segment ahead.

A :class:`SegmentedArray` holds rows of one shape and dtype in segments of ``segment_rows`` rows (a
power of two, by default the largest one whose segment stays within :data:`SEGMENT_BYTES`). Row ``r``
lives in segment ``r >> log2(segment_rows)`` at offset ``r & (segment_rows - 1)``. While the array is
smaller than one segment it is a single short segment that grows by doubling (a copy of less than one
segment); past that, growing appends zeroed segments, so the bytes allocated stay within one segment of
the rows asked for and old rows never move.

It is not a NumPy array: it supports ``a[rows]`` (a gathered copy), ``a[rows] = v``, ``a[i:j]`` (a copy)
and ``a[i:j] = v``, :meth:`SegmentedArray.take` into a given buffer, and :meth:`SegmentedArray.chunks`
to read the rows segment by segment without a whole copy. Gathers and scatters of row arrays run as
compiled loops (numba) that visit the rows grouped by segment; the NumPy fallback gives the same answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from carls_dask.errors import ArgumentTypeError, ConfigError, InvalidShapeError, RowIndexError

__all__ = ["SEGMENT_BYTES", "SegmentedArray", "segment_rows_for"]

#: Target bytes of one segment (the largest power-of-two row count within it is used).
SEGMENT_BYTES = 16 << 20
#: Bounds of the rows of one segment.
MIN_SEGMENT_ROWS = 1 << 10
MAX_SEGMENT_ROWS = 1 << 20
#: Rows of the first (short) segment of an empty array.
_FIRST_ROWS = 16

numba: Any
try:
    import numba
    from numba.typed import List as TypedList
except ImportError:  # pragma: no cover - numba comes with the install
    numba = None
    TypedList = None

if numba is not None:

    @numba.njit(cache=True, nogil=True)
    def _group_by_segment(rows, shift, n_segments, hi):
        # positions of the rows in segment order (a counting sort); rows are clipped to [0, hi]
        n = rows.shape[0]
        counts = np.zeros(n_segments + 1, dtype=np.int64)
        clipped = np.empty(n, dtype=np.int64)
        for i in range(n):
            r = rows[i]
            if r < 0:
                r = 0
            elif r > hi:
                r = hi
            clipped[i] = r
            counts[(r >> shift) + 1] += 1
        for s in range(n_segments):
            counts[s + 1] += counts[s]
        order = np.empty(n, dtype=np.int64)
        fill = counts[:-1].copy()
        for i in range(n):
            s = clipped[i] >> shift
            order[fill[s]] = i
            fill[s] += 1
        return clipped, order, counts

    @numba.njit(cache=True, nogil=True)
    def _gather_compiled(segments, shift, mask, rows, hi, out):
        clipped, order, starts = _group_by_segment(rows, shift, len(segments), hi)
        w = out.shape[1]
        for s in range(len(segments)):
            a, b = starts[s], starts[s + 1]
            if a == b:
                continue
            seg = segments[s]
            for p in range(a, b):
                i = order[p]
                o = clipped[i] & mask
                for j in range(w):
                    out[i, j] = seg[o, j]

    @numba.njit(cache=True, nogil=True)
    def _scatter_compiled(segments, shift, mask, rows, hi, values):
        # positions keep their batch order within a segment, so the last write of a row wins
        clipped, order, starts = _group_by_segment(rows, shift, len(segments), hi)
        w = values.shape[1]
        for s in range(len(segments)):
            a, b = starts[s], starts[s + 1]
            if a == b:
                continue
            seg = segments[s]
            for p in range(a, b):
                i = order[p]
                o = clipped[i] & mask
                for j in range(w):
                    seg[o, j] = values[i, j]

    @numba.njit(cache=True, nogil=True)
    def _scatter_from_compiled(segments, shift, mask, rows, hi, values, src):
        # row rows[i] takes values[src[i]]; the rows are distinct
        clipped, order, starts = _group_by_segment(rows, shift, len(segments), hi)
        w = values.shape[1]
        for s in range(len(segments)):
            a, b = starts[s], starts[s + 1]
            if a == b:
                continue
            seg = segments[s]
            for p in range(a, b):
                i = order[p]
                o = clipped[i] & mask
                k = src[i]
                for j in range(w):
                    seg[o, j] = values[k, j]


def segment_rows_for(row_bytes: int, segment_bytes: int = SEGMENT_BYTES) -> int:
    """Rows of one segment: the largest power of two with ``rows * row_bytes <= segment_bytes`` (bounded)."""
    rows = max(1, int(segment_bytes) // max(1, int(row_bytes)))
    rows = 1 << (rows.bit_length() - 1)
    return int(min(MAX_SEGMENT_ROWS, max(MIN_SEGMENT_ROWS, rows)))


def _word(itemsize: int) -> np.dtype[Any]:
    """The unsigned integer dtype of ``itemsize`` bytes (kernels copy bits, whatever the dtype)."""
    return np.dtype(f"u{itemsize}")


class SegmentedArray:
    """Rows of ``row_shape`` and ``dtype`` in fixed-size segments.

    Parameters
    ----------
    row_shape
        Shape of one row (``()`` for one value per row).
    dtype
        Element dtype.
    capacity
        Rows to allocate at once.
    segment_rows
        Rows per segment (a power of two); by default from :func:`segment_rows_for`.

    Notes
    -----
    ``shape[0]`` and ``len()`` are the rows allocated (the capacity), as for the arrays this replaces;
    the owner keeps count of the rows in use. Allocated rows not yet written read as zeros.
    """

    def __init__(self, row_shape: tuple[int, ...], dtype: Any, capacity: int = 0,
                 segment_rows: int | None = None) -> None:
        self.row_shape = tuple(int(s) for s in row_shape)
        self.dtype = np.dtype(dtype)
        self.width = max(1, math.prod(self.row_shape))
        row_bytes = self.width * self.dtype.itemsize
        seg = segment_rows_for(row_bytes) if segment_rows is None else int(segment_rows)
        if seg < 1 or seg & (seg - 1):
            raise ConfigError(f"SegmentedArray: segment_rows must be a power of two >= 1, got {segment_rows!r}")
        self.segment_rows = seg
        self._shift = seg.bit_length() - 1
        self._mask = seg - 1
        self._segments: list[np.ndarray] = []
        self._words: Any = None  # typed list of the segments' [rows, width] unsigned views (kernels)
        self._flat: Any = None  # the same as [rows, width] views of the dtype (arithmetic kernels), built on use
        self._cap = 0
        self.reserve(max(int(capacity), 0))

    # -- shape --------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """``(capacity, *row_shape)``."""
        return (self._cap, *self.row_shape)

    @property
    def ndim(self) -> int:
        """Dimensions of :attr:`shape`."""
        return 1 + len(self.row_shape)

    def __len__(self) -> int:
        return self._cap

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the segments."""
        return sum(int(s.nbytes) for s in self._segments)

    @property
    def n_segments(self) -> int:
        """Segments allocated."""
        return len(self._segments)

    def __repr__(self) -> str:
        return (f"SegmentedArray(shape={self.shape}, dtype={self.dtype}, segment_rows={self.segment_rows}, "
                f"segments={len(self._segments)})")

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise ArgumentTypeError("SegmentedArray is not a numpy array: read rows with a[rows], a[i:j] or a.take(rows)")

    # -- growth -------------------------------------------------------------------------------------
    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total (never moves rows of full segments)."""
        rows = int(rows)
        if rows <= self._cap:
            return
        seg = self.segment_rows
        if self._cap < seg:  # the single short segment: double it (a copy of under one segment)
            new = min(seg, max(rows, _FIRST_ROWS, 2 * self._cap))
            grown = np.zeros((new, *self.row_shape), dtype=self.dtype)
            if self._segments:
                grown[: self._cap] = self._segments[0]
                self._segments[0] = grown
            else:
                self._segments.append(grown)
            self._cap = new
        while self._cap < rows:
            self._segments.append(np.zeros((seg, *self.row_shape), dtype=self.dtype))
            self._cap += seg
        self._rebuild_words()

    def _rebuild_words(self) -> None:
        if numba is None:
            return
        word = _word(self.dtype.itemsize)
        views = [s.reshape(s.shape[0], self.width).view(word) for s in self._segments]
        words = TypedList()
        for v in views:
            words.append(v)
        self._words = words
        self._flat = None

    def kernel_segments(self) -> Any:
        """The segments as a numba typed list of ``[segment_rows, width]`` arrays of the dtype (views), for
        compiled loops that compute on the rows in place; valid until the next growth. None without numba."""
        if numba is None:
            return None
        if self._flat is None:
            flat = TypedList()
            for seg in self._segments:
                flat.append(seg.reshape(seg.shape[0], self.width))
            self._flat = flat
        return self._flat

    @property
    def segment_shift(self) -> int:
        """``log2(segment_rows)``: row ``r`` lives in segment ``r >> segment_shift``."""
        return self._shift

    # -- helpers ------------------------------------------------------------------------------------
    def _rows(self, key: Any) -> np.ndarray:
        rows = np.asarray(key)
        if rows.dtype == bool:
            if rows.shape != (self._cap,):
                raise RowIndexError(f"SegmentedArray: a boolean mask must have shape ({self._cap},), got {rows.shape}")
            return np.flatnonzero(rows)
        if rows.dtype.kind not in "iu" or rows.ndim != 1:
            raise RowIndexError(f"SegmentedArray: rows must be a 1-D integer array, a slice or an int; got "
                             f"{rows.dtype} of shape {rows.shape}")
        rows = rows.astype(np.int64, copy=False)
        if rows.size:
            lo, hi = int(rows.min()), int(rows.max())
            if lo < -self._cap or hi >= self._cap:
                raise RowIndexError(f"SegmentedArray: row {lo if lo < -self._cap else hi} is out of range for "
                                 f"{self._cap} rows")
            if lo < 0:
                rows = np.where(rows < 0, rows + self._cap, rows)
        return rows

    def _slice(self, key: slice) -> tuple[int, int]:
        start, stop, step = key.indices(self._cap)
        if step != 1:
            raise RowIndexError(f"SegmentedArray: slices must have step 1, got {step}")
        return start, max(start, stop)

    def _parts(self, start: int, stop: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(offset in the range, rows, segment view)`` of each segment part of rows ``[start, stop)``."""
        seg = self.segment_rows
        pos = start
        while pos < stop:
            s, o = pos >> self._shift, pos & self._mask
            take = min(stop - pos, seg - o)
            yield pos - start, take, self._segments[s][o: o + take]
            pos += take

    # -- reads --------------------------------------------------------------------------------------
    def take(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` gathered into ``out`` (new when None); rows outside the array are clipped (``mode="clip"``)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        n = rows.shape[0]
        if out is None:
            out = np.empty((n, *self.row_shape), dtype=self.dtype)
        elif out.shape != (n, *self.row_shape) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise InvalidShapeError(f"SegmentedArray.take: out must be C-contiguous {self.dtype} of shape "
                             f"{(n, *self.row_shape)}, got {out.dtype} of shape {out.shape}")
        if n == 0 or self._cap == 0:
            return out
        if numba is not None:
            flat = out.reshape(n, self.width).view(_word(self.dtype.itemsize))
            _gather_compiled(self._words, self._shift, self._mask, rows, self._cap - 1, flat)
            return out
        clipped = np.clip(rows, 0, self._cap - 1)
        seg = clipped >> self._shift
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            out[sel] = self._segments[int(s)][clipped[sel] & self._mask]
        return out

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop = self._slice(key)
            out = np.empty((stop - start, *self.row_shape), dtype=self.dtype)
            for at, m, part in self._parts(start, stop):
                out[at: at + m] = part
            return out
        if isinstance(key, int | np.integer):
            r = int(key) + (self._cap if int(key) < 0 else 0)
            if not 0 <= r < self._cap:
                raise RowIndexError(f"SegmentedArray: row {int(key)} is out of range for {self._cap} rows")
            return self._segments[r >> self._shift][r & self._mask].copy()
        return self.take(self._rows(key))

    def chunks(self, stop: int | None = None, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, rows)`` of rows ``[start, stop)`` segment by segment: views, valid until the next growth."""
        start, stop = self._slice(slice(start, stop))
        for at, _m, part in self._parts(start, stop):
            yield start + at, part

    # -- writes -------------------------------------------------------------------------------------
    def put(self, rows: np.ndarray, values: np.ndarray, src: np.ndarray) -> None:
        """``a[rows[i]] = values[src[i]]`` for distinct in-range ``rows``, without gathering ``values[src]`` first.

        Parameters
        ----------
        rows
            ``int64[m]`` distinct rows, each in ``[0, len(a))``.
        values
            ``[n, *row_shape]`` values of the dtype.
        src
            ``int64[m]`` positions in ``values``.
        """
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        src = np.ascontiguousarray(src, dtype=np.int64)
        m = rows.shape[0]
        if m == 0:
            return
        v = np.ascontiguousarray(values, dtype=self.dtype)
        if numba is None:
            self[rows] = v[src]
            return
        flat = v.reshape(v.shape[0], self.width).view(_word(self.dtype.itemsize))
        _scatter_from_compiled(self._words, self._shift, self._mask, rows, self._cap - 1, flat, src)

    def _values(self, value: Any, n: int) -> np.ndarray:
        v = np.asarray(value)
        try:
            v = np.broadcast_to(v, (n, *self.row_shape))
        except ValueError:
            raise InvalidShapeError(f"SegmentedArray: cannot write values of shape {v.shape} into {n} rows of shape "
                             f"{self.row_shape}") from None
        return np.ascontiguousarray(v, dtype=self.dtype)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice):
            start, stop = self._slice(key)
            v = np.asarray(value)
            whole = v.ndim == len(self.row_shape) + 1 and v.shape[0] == stop - start
            for at, m, part in self._parts(start, stop):
                part[...] = v[at: at + m] if whole else v
            return
        if isinstance(key, int | np.integer):
            key = np.array([int(key)])
            value = np.asarray(value)[None]
        rows = self._rows(key)
        n = rows.shape[0]
        if n == 0:
            return
        v = self._values(value, n)
        if numba is not None:
            flat = v.reshape(n, self.width).view(_word(self.dtype.itemsize))
            _scatter_compiled(self._words, self._shift, self._mask, np.ascontiguousarray(rows), self._cap - 1,
                              flat)
            return
        seg = rows >> self._shift
        for s in np.unique(seg):
            sel = np.flatnonzero(seg == s)
            self._segments[int(s)][rows[sel] & self._mask] = v[sel]
