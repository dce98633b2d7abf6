"""Compiled single passes over a batch: routing it to shards, deduplicating its keys, moving and checking rows.

Each function here replaces a chain of NumPy calls that walk the batch several times and allocate a
temporary per step (hash, then bucket, then owner, then one mask per shard; a sort to find distinct keys;
``isfinite`` into a boolean array, then ``all``) by one compiled loop over the batch. The answers are the
ones the NumPy chains give; without numba (:mod:`carls_dask.bank.jit`) the NumPy chains run instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from carls_dask.bank.hashing import bucket_of_hash, splitmix64
from carls_dask.bank.jit import numba

__all__ = ["all_finite", "dedupe", "hash_keys", "put_rows", "route", "take_rows", "touch_rows"]

if numba is not None:

    @numba.njit(cache=True, nogil=True, inline="always")
    def _bucket(h, buckets):
        # h % buckets, a mask when buckets is a power of two (the default; a division costs tens of cycles)
        nb = np.uint64(buckets)
        if buckets & (buckets - 1) == 0:
            return np.int64(h & (nb - np.uint64(1)))
        return np.int64(h % nb)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _mix(x):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    @numba.njit(cache=True, nogil=True)
    def _shards_compiled(keys, owner, buckets, out):
        # the shard of each key: splitmix64, bucket, owner
        for i in range(keys.shape[0]):
            out[i] = owner[_bucket(_mix(np.uint64(keys[i])), buckets)]

    @numba.njit(cache=True, nogil=True)
    def _dedupe_compiled(keys, hashes, keep_last, pos, inverse, counts):
        # distinct keys in order of first occurrence through an open-addressing table of twice the batch
        n = keys.shape[0]
        size = 16
        bits = 4
        while size < 2 * n:
            size *= 2
            bits += 1
        shift = np.uint64(64 - bits)
        mask = size - 1
        slots = np.full(size, -1, dtype=np.int64)
        u = 0
        for i in range(n):
            p = np.int64(hashes[i] >> shift)
            k = keys[i]
            while True:
                at = slots[p]
                if at < 0:
                    slots[p] = u
                    pos[u] = i
                    counts[u] = 1
                    inverse[i] = u
                    u += 1
                    break
                if keys[pos[at]] == k:
                    if keep_last:
                        pos[at] = i
                    counts[at] += 1
                    inverse[i] = at
                    break
                p = (p + 1) & mask
        return u

    @numba.njit(cache=True, nogil=True)
    def _take_compiled(src, pos, out):
        w = src.shape[1]
        for i in range(pos.shape[0]):
            p = pos[i]
            for j in range(w):
                out[i, j] = src[p, j]

    @numba.njit(cache=True, nogil=True)
    def _put_compiled(dst, pos, src):
        w = src.shape[1]
        for i in range(pos.shape[0]):
            p = pos[i]
            for j in range(w):
                dst[p, j] = src[i, j]

    @numba.njit(cache=True, nogil=True)
    def _hash_compiled(keys, buckets, owned, check, hashes, bucket_out):
        for i in range(keys.shape[0]):
            h = _mix(np.uint64(keys[i]))
            b = _bucket(h, buckets)
            if check and not owned[b]:
                return i
            hashes[i] = h
            bucket_out[i] = b
        return -1

    @numba.njit(cache=True, nogil=True)
    def _touch_compiled(meta, maker, marks, rows, now_bits, step, set_step, code, set_maker):
        for i in range(rows.shape[0]):
            r = rows[i]
            meta[r, 1] += 1
            meta[r, 4] = now_bits
            if set_step:
                meta[r, 2] = step
            if set_maker:
                maker[r] = code
            marks[r] = True

    @numba.njit(cache=True, nogil=True)
    def _all_finite_compiled(bits, exponent):
        # NaN and +-Inf are the values whose exponent bits are all set; blocks of integer tests vectorise
        n = bits.shape[0]
        for start in range(0, n, 4096):
            bad = 0
            for i in range(start, min(n, start + 4096)):
                bad |= (bits[i] & exponent) == exponent
            if bad:
                return False
        return True


def route(keys: np.ndarray, owner: np.ndarray, buckets: int) -> list[np.ndarray]:
    """The positions of ``keys`` held by each shard, in batch order.

    Parameters
    ----------
    keys
        ``int64[n]`` keys.
    owner
        ``int32[buckets]``: the shard owning each bucket.
    buckets
        Number of hash buckets.

    Returns
    -------
    list of numpy.ndarray
        ``int64`` positions per shard (``owner.max() + 1`` of them, some maybe empty).
    """
    n_shards = int(owner.max()) + 1 if owner.size else 1
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if numba is not None:
        shard = np.empty(keys.shape[0], dtype=np.int32)
        _shards_compiled(keys, np.ascontiguousarray(owner, dtype=np.int32), np.int64(buckets), shard)
    else:
        shard = owner[bucket_of_hash(splitmix64(keys.view(np.uint64)), buckets)]
    if n_shards <= 8:  # a few boolean passes beat a sort
        return [np.flatnonzero(shard == s) for s in range(n_shards)]
    order = np.argsort(shard, kind="stable")
    return np.split(order, np.cumsum(np.bincount(shard, minlength=n_shards))[:-1])


def dedupe(keys: np.ndarray, hashes: np.ndarray | None = None, *, keep: str = "first"
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct keys of a batch, in order of first occurrence.

    Parameters
    ----------
    keys
        ``int64[n]`` keys, duplicates allowed.
    hashes
        ``splitmix64(keys)`` when the caller has them.
    keep
        ``"first"`` or ``"last"``: which occurrence of a key :attr:`pos` points at.

    Returns
    -------
    tuple
        ``pos`` (``int64[u]``: the chosen occurrence of each distinct key), ``inverse`` (``int64[n]``: the
        distinct key of each position) and ``counts`` (``int64[u]``: occurrences of each).
    """
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    n = keys.shape[0]
    if hashes is None:
        hashes = splitmix64(keys.view(np.uint64))
    if numba is not None:
        pos = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.empty(n, dtype=np.int64)
        u = int(_dedupe_compiled(keys, np.ascontiguousarray(hashes, dtype=np.uint64), keep == "last", pos, inverse,
                                 counts))
        return pos[:u].copy(), inverse, counts[:u].copy()
    _, first, inv, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    chosen = first if keep == "first" else n - 1 - np.unique(keys[::-1], return_index=True)[1]
    order = np.argsort(first, kind="stable")  # the distinct keys by first occurrence, as the compiled pass gives
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return chosen[order].astype(np.int64), rank[inv.reshape(-1)].astype(np.int64), counts[order].astype(np.int64)


def hash_keys(keys: np.ndarray, buckets: int, owned: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, int]:
    """``splitmix64`` of each key and its bucket, checking that the bucket is in ``owned`` (a ``bool[buckets]``).

    Returns
    -------
    tuple
        ``hashes`` (``uint64[n]``), ``buckets`` (``int32[n]``) and the position of the first key of a bucket
        not owned (-1 when all are owned; the outputs are then partly written).
    """
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    n = keys.shape[0]
    if numba is not None:
        h = np.empty(n, dtype=np.uint64)
        b = np.empty(n, dtype=np.int32)
        bad = int(_hash_compiled(keys, np.int64(buckets), owned if owned is not None else np.ones(1, dtype=bool),
                                 owned is not None, h, b))
        return h, b, bad
    h = splitmix64(keys.view(np.uint64))
    b = bucket_of_hash(h, buckets)
    if owned is not None:
        out = ~owned[b]
        if out.any():
            return h, b, int(np.flatnonzero(out)[0])
    return h, b, -1


def touch_rows(meta: np.ndarray, maker: np.ndarray, marks: np.ndarray, rows: np.ndarray, now: float,
               model_step: int | None, code: int | None) -> None:
    """A write's provenance in one pass over its distinct ``rows``: version + 1, wall time ``now``, optionally
    model step and maker code, and the change mark.

    ``meta`` is a table's ``int64[cap, 5]`` (key, version, model step, frequency, wall-time bits), ``maker`` its
    ``int32[cap]`` maker codes, ``marks`` its ``bool[>= rows]`` change marks.
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    now_bits = np.array([now], dtype=np.float64).view(np.int64)[0]  # the scalar, not a 0-d array
    if numba is not None:
        _touch_compiled(meta, maker, marks, rows, now_bits, np.int64(model_step or 0), model_step is not None,
                        np.int32(code or 0), code is not None)
        return
    meta[rows, 1] += 1
    meta[rows, 4] = now_bits
    if model_step is not None:
        meta[rows, 2] = model_step
    if code is not None:
        maker[rows] = code
    marks[rows] = True


def _words(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array as ``[rows, words]`` of unsigned words (the kernels copy bits, whatever the dtype)."""
    n = a.shape[0]
    flat = a.reshape(n, -1)
    size = a.dtype.itemsize
    return flat.view(np.dtype(f"u{size}")) if size in (1, 2, 4, 8) else flat.view(np.uint8)


def take_rows(src: np.ndarray, pos: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``src[pos]`` (``pos`` in range) into ``out`` (new when None), in one compiled pass."""
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if out is None:
        out = np.empty((pos.shape[0], *src.shape[1:]), dtype=src.dtype)
    if numba is None or not src.flags.c_contiguous or src.ndim == 1 or pos.shape[0] == 0:
        if src.flags.c_contiguous:
            np.take(src, pos, axis=0, out=out)
        else:  # np.take would copy a strided array whole before gathering
            out[...] = src[pos]
        return out
    _take_compiled(_words(src), pos, _words(out))
    return out


def put_rows(dst: np.ndarray, pos: np.ndarray, src: np.ndarray) -> None:
    """``dst[pos] = src`` (``pos`` in range, distinct) in one compiled pass."""
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if numba is None or not dst.flags.c_contiguous or dst.ndim == 1 or pos.shape[0] == 0:
        dst[pos] = src
        return
    _put_compiled(_words(dst), pos, _words(np.ascontiguousarray(src, dtype=dst.dtype)))


def all_finite(arr: Any) -> bool:
    """Whether a float array holds no NaN or Inf (True for other dtypes), without a temporary array."""
    a = np.asarray(arr)
    if a.dtype.kind != "f" or a.size == 0:
        return True
    if numba is None or a.dtype.itemsize not in (4, 8) or not a.flags.c_contiguous:
        return bool(np.isfinite(a).all())
    if a.dtype.itemsize == 4:
        return bool(_all_finite_compiled(a.reshape(-1).view(np.uint32), np.uint32(0x7F800000)))
    return bool(_all_finite_compiled(a.reshape(-1).view(np.uint64), np.uint64(0x7FF0000000000000)))
