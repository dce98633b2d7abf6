"""Deterministic initial values of new rows, as compiled loops.

The values are those of :func:`carls_dask.bank.hashing.normal_from_keys` and
:func:`~carls_dask.bank.hashing.uniform_from_keys` (the same bits, the same float64 arithmetic, then
cast to the column's dtype; on CPUs with AVX-512 NumPy's vectorised ``log1p`` can differ from the C
library's, which the compiled loop calls, by one unit in the last place: up to 3 in a float64 normal
value), computed in one pass per key without the ``[n, width]`` float64 temporaries of the NumPy form,
straight into the rows that hold them when the caller gives them. Without numba the NumPy form is used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from carls_dask.bank.hashing import normal_from_keys, uniform_from_keys
from carls_dask.bank.jit import numba
from carls_dask.errors import ConfigError

__all__ = ["initial_block"]

if numba is not None:

    @numba.njit(cache=True, nogil=True, inline="always")
    def _splitmix(z):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    @numba.njit(cache=True, nogil=True)
    def _fill_compiled(keys, seed, scale, normal, out):
        golden = np.uint64(0x9E3779B97F4A7C15)
        inv = 1.0 / 9007199254740992.0
        two_pi = 2.0 * math.pi
        w = out.shape[1]
        for i in range(keys.shape[0]):
            base = _splitmix(np.uint64(keys[i]) ^ seed)
            for j in range(w):
                u1 = np.float64(_splitmix(base + np.uint64(2 * j) * golden) >> np.uint64(11)) * inv
                if normal:
                    u2 = np.float64(_splitmix(base + np.uint64(2 * j + 1) * golden) >> np.uint64(11)) * inv
                    z = math.sqrt(-2.0 * math.log1p(-u1)) * math.cos(two_pi * u2)
                    out[i, j] = z * scale
                else:
                    out[i, j] = (2.0 * u1 - 1.0) * scale


def initial_block(kind: str, keys: np.ndarray, seed: int, shape: tuple[int, ...], scale: float,
                  dtype: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``[n, *shape]`` initial values of ``kind`` (``"normal"`` or ``"uniform"``) for ``keys``.

    Parameters
    ----------
    kind
        ``"normal"`` (``scale * N(0, 1)``) or ``"uniform"`` (``U(-scale, scale)``).
    keys
        ``int64[n]`` keys.
    seed
        The column's seed (a 64-bit unsigned int).
    shape
        Shape of one row.
    scale
        Scale of the values.
    dtype
        Dtype of the result.
    out
        Where to write the values (``[n, *shape]`` of ``dtype``, C-contiguous); a new array when None.
    """
    if kind not in ("normal", "uniform"):
        raise ConfigError(f"initial_block: kind must be 'normal' or 'uniform', got {kind!r}")
    k = np.ascontiguousarray(keys, dtype=np.int64)
    width = max(1, math.prod(shape))
    dt = np.dtype(dtype)
    full = (k.shape[0], *shape)
    if numba is None:
        if kind == "uniform":
            got = ((2.0 * uniform_from_keys(k, seed, width) - 1.0) * scale).reshape(full).astype(dt)
        else:
            got = (normal_from_keys(k, seed, width) * scale).reshape(full).astype(dt)
    else:
        # the kernel rounds float64 to float32/float64 on store; other dtypes go through float64
        direct = dt in (np.dtype(np.float32), np.dtype(np.float64))
        if direct and out is not None and out.flags.c_contiguous:
            _fill_compiled(k, np.uint64(seed), float(scale), kind == "normal", out.reshape(k.shape[0], width))
            return out
        flat = np.empty((k.shape[0], width), dtype=dt if direct else np.float64)
        _fill_compiled(k, np.uint64(seed), float(scale), kind == "normal", flat)
        got = flat.reshape(full).astype(dt, copy=False)
    if out is None:
        return got
    out[...] = got
    return out
