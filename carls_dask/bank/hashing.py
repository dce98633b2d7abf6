"""Stable, vectorized hashing: string keys, buckets and deterministic per-key random numbers.

All functions are pure NumPy and give the same answer on every machine and process (no Python
``hash``), so routing, bucket ownership and initial values are reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from carls_dask.errors import InvalidBatchError, InvalidDTypeError, InvalidShapeError

__all__ = [
    "bucket_of",
    "bucket_of_hash",
    "hash_string",
    "mix_seed",
    "normal_from_keys",
    "splitmix64",
    "to_int64_keys",
    "uniform_from_keys",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer applied elementwise (input viewed as uint64, output uint64)."""
    x = np.asarray(x)
    if x.dtype != np.uint64:
        x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = np.add(x, _GOLDEN)  # the one output array; every later step works in place
        t = np.empty_like(z)
        np.right_shift(z, _S30, out=t)
        z ^= t
        z *= _M1
        np.right_shift(z, _S27, out=t)
        z ^= t
        z *= _M2
        np.right_shift(z, _S31, out=t)
        z ^= t
    return z


def hash_string(s: str) -> int:
    """Stable signed 64-bit hash of a string (first 8 bytes of BLAKE2b, little endian)."""
    digest = hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def to_int64_keys(keys: Any, table: str = "?") -> np.ndarray:
    """Turn a batch of keys (int array, list of ints, or strings) into ``int64[n]``.

    Strings are hashed with :func:`hash_string`.

    Raises
    ------
    InvalidDTypeError, InvalidShapeError, InvalidBatchError
        For float keys, non-1-D batches, or integers outside the int64 range.
    """
    if isinstance(keys, str | bytes):
        raise InvalidShapeError(f"table {table!r}: keys must be a batch (1-D array or list), got a single {type(keys).__name__}")
    arr = np.asarray(keys) if not isinstance(keys, np.ndarray) else keys
    if arr.dtype.kind in "US" and not isinstance(keys, np.ndarray) and arr.ndim == 1 \
            and not all(isinstance(k, str) for k in keys):  # numpy turns [1, "a"] into strings
        kinds = sorted({type(k).__name__ for k in keys})
        raise InvalidDTypeError(f"table {table!r}: keys must be all int64 or all str; got a mix of {kinds}")
    if arr.dtype.kind in "UO" and arr.ndim == 1 and all(isinstance(k, str) for k in arr.tolist()):
        return np.fromiter((hash_string(k) for k in arr.tolist()), dtype=np.int64, count=arr.size)
    if arr.dtype.kind == "O":
        raise InvalidDTypeError(f"table {table!r}: keys must be all int64 or all str; got a mixed object array")
    if arr.ndim != 1:
        raise InvalidShapeError(f"table {table!r}: keys must be a 1-D array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidDTypeError(f"table {table!r}: keys must be int64 or str, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidBatchError(
            f"table {table!r}: key {int(arr.max())} is out of range; expected keys within the int64 range"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each key: ``splitmix64(key) % buckets`` as ``int32[n]``."""
    return bucket_of_hash(splitmix64(np.asarray(keys, dtype=np.int64).view(np.uint64)), buckets)


def bucket_of_hash(h: np.ndarray, buckets: int) -> np.ndarray:
    """:func:`bucket_of` from precomputed ``splitmix64(key)`` hashes (``uint64``)."""
    if buckets & (buckets - 1) == 0:  # a power of two: same result as the modulo, much cheaper
        return (h & np.uint64(buckets - 1)).astype(np.int32)
    return (h % np.uint64(buckets)).astype(np.int32)


def mix_seed(*parts: str | int) -> int:
    """Combine names and numbers into one stable 64-bit seed (as a Python int in [0, 2**64))."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode("utf-8"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little", signed=False)


def _key_element_bits(keys: np.ndarray, seed: int, width: int, stream: int) -> np.ndarray:
    """uint64 bits of shape ``[n, width]`` that depend only on (key, seed, element, stream)."""
    k = np.asarray(keys, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        base = splitmix64(k ^ np.uint64(seed))
        j = (np.arange(width, dtype=np.uint64) * np.uint64(2) + np.uint64(stream)) * _GOLDEN
        return splitmix64(base[:, None] + j[None, :])


def uniform_from_keys(keys: np.ndarray, seed: int, width: int, stream: int = 0) -> np.ndarray:
    """Uniform float64 numbers in ``[0, 1)`` of shape ``[n, width]``, a pure function of (key, seed)."""
    bits = _key_element_bits(keys, seed, width, stream)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def normal_from_keys(keys: np.ndarray, seed: int, width: int) -> np.ndarray:
    """Standard normal float64 numbers of shape ``[n, width]`` (Box-Muller), a pure function of (key, seed)."""
    u1 = uniform_from_keys(keys, seed, width, stream=0)
    u2 = uniform_from_keys(keys, seed, width, stream=1)
    r = np.sqrt(-2.0 * np.log1p(-u1))  # 1 - u1 lies in (0, 1]
    return r * np.cos(2.0 * np.pi * u2)


def as_list(x: Iterable[int]) -> list[int]:
    """Plain list of Python ints (JSON-able)."""
    return [int(v) for v in x]
