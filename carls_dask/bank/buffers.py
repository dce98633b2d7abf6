"""Reusable output buffers for a shard's answers.

Dask starts worker processes with ``MALLOC_TRIM_THRESHOLD_`` set, which also fixes glibc's mmap
threshold at 128 KiB: every large array a worker allocates is a fresh mapping whose pages fault in
one by one as they are first written, and every free hands them back: for a shard answering large
batches, the page faults cost as much as gathering the rows. :class:`BufferPool` keeps a few large
buffers and hands one out again once nothing
refers to it any more: the reply has been sent, or the caller of a co-located lookup dropped it.
Whether a buffer is still referred to is read from its reference count, so a buffer that any array,
memoryview or tensor still uses is never handed out twice.
"""

from __future__ import annotations

import math
import sys

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Buffers of power-of-two sizes, recycled when unreferenced.

    Parameters
    ----------
    max_bytes
        Most bytes the pool keeps; past it, requests get plain new arrays.
    min_bytes
        Smaller requests get plain new arrays (malloc serves them from its heap cheaply).
    per_size
        Most buffers kept of one size.
    """

    def __init__(self, max_bytes: int, min_bytes: int = 1 << 17, per_size: int = 4) -> None:
        self.max_bytes = int(max_bytes)
        self.min_bytes = int(min_bytes)
        self.per_size = int(per_size)
        self._free: dict[int, list[np.ndarray]] = {}
        self.bytes = 0
        self.reused = 0
        self.allocated = 0
        probe = [np.empty(1, dtype=np.uint8)]
        self._idle_refs = self._refs(probe)

    @staticmethod
    def _refs(buffers: list[np.ndarray]) -> int:
        """Reference count of the first buffer as seen from the loop in :meth:`empty` (list, loop name, call)."""
        for base in buffers:
            return sys.getrefcount(base)
        return 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (from the pool when large)."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self.min_bytes or self.max_bytes <= 0:
            return np.empty(shape, dtype=dt)
        size = 1 << (nbytes - 1).bit_length()
        kept = self._free.setdefault(size, [])
        for base in kept:
            if sys.getrefcount(base) <= self._idle_refs:
                self.reused += 1
                return base[:nbytes].view(dt).reshape(shape)
        if len(kept) >= self.per_size or self.bytes + size > self.max_bytes:
            return np.empty(shape, dtype=dt)
        base = np.empty(size, dtype=np.uint8)
        kept.append(base)
        self.bytes += size
        self.allocated += 1
        return base[:nbytes].view(dt).reshape(shape)

    def clear(self) -> None:
        """Drop the pool's buffers (arrays handed out stay valid)."""
        self._free.clear()
        self.bytes = 0
