"""Helpers that read the parts of a bank snapshot dataset the views need.

A bank table opens (through :func:`carls_dask.storage.open_bank`) as an :class:`xarray.Dataset` with a ``key``
dimension, one variable per column (``embedding`` over ``("key", "dim")``, ``pseudo_label`` over
``("key",)``, ...) and the provenance variables ``version``, ``model_step``, ``maker``, ``wall_time``
and ``frequency``. These functions only look at that layout; they never import Dask or touch a store.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import xarray as xr

from carls_dask.errors import InvalidBatchError, UnknownColumnError

__all__ = ["column", "common_rows", "has_column", "keys_of", "shards_of", "stable_sample"]

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _name(ds: xr.Dataset) -> str:
    return str(ds.attrs.get("table", ds.attrs.get("name", "bank table")))


def keys_of(ds: xr.Dataset) -> np.ndarray:
    """Return the int64 keys of a bank table dataset (the ``key`` coordinate, or a ``keys`` variable)."""
    for name in ("key", "keys"):
        if name in ds.variables:
            return np.asarray(ds[name].values, dtype=np.int64)
    if "key" in ds.sizes:
        return np.arange(ds.sizes["key"], dtype=np.int64)
    raise UnknownColumnError(
        f"{_name(ds)}: expected a 'key' dimension or coordinate, got dims {sorted(map(str, ds.sizes))}"
    )


def has_column(ds: xr.Dataset, name: Hashable) -> bool:
    """Whether ``ds`` holds a variable ``name`` laid out over the ``key`` dimension."""
    return name in ds.data_vars and "key" in ds[name].dims


def column(ds: xr.Dataset, name: str) -> np.ndarray:
    """Return column ``name`` of the table as a numpy array (rows on axis 0).

    Raises
    ------
    UnknownColumnError
        If the table has no such column; the message lists the columns it has.
    """
    if not has_column(ds, name):
        have = sorted(str(v) for v in ds.data_vars if "key" in ds[v].dims)
        raise UnknownColumnError(f"{_name(ds)}: no column {name!r}; the table has columns {have}")
    return np.asarray(ds[name].values)


def shards_of(ds: xr.Dataset) -> np.ndarray:
    """Return the shard of every row.

    Uses a ``shard`` variable when the snapshot carries one, else ``bucket % n_shards`` (the default
    bucket ownership) when the dataset has a ``bucket`` variable and an ``n_shards`` attribute, else
    puts every row in shard 0.
    """
    n = ds.sizes.get("key", 0)
    if has_column(ds, "shard"):
        return np.asarray(ds["shard"].values, dtype=np.int64)
    n_shards = ds.attrs.get("n_shards")
    if has_column(ds, "bucket") and n_shards:
        return np.asarray(ds["bucket"].values, dtype=np.int64) % int(n_shards)
    return np.zeros(n, dtype=np.int64)


def common_rows(a: xr.Dataset, b: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Match the rows of two snapshots of one table by key.

    Returns
    -------
    keys, ia, ib
        The keys present in both (sorted) and their row positions in ``a`` and in ``b``.
    """
    ka, kb = keys_of(a), keys_of(b)
    keys, ia, ib = np.intersect1d(ka, kb, assume_unique=False, return_indices=True)
    return keys, ia, ib


def _mix(keys: np.ndarray) -> np.ndarray:
    z = keys.astype(np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def stable_sample(keys: np.ndarray, n: int) -> np.ndarray:
    """Pick up to ``n`` keys by a fixed hash, so successive snapshots pick (mostly) the same keys.

    Parameters
    ----------
    keys
        int64 keys of one snapshot.
    n
        How many to keep; must be positive.

    Returns
    -------
    numpy.ndarray
        Positions (into ``keys``) of the chosen rows, in increasing order.
    """
    if n <= 0:
        raise InvalidBatchError(f"stable_sample: expected a positive sample size, got {n}")
    keys = np.asarray(keys, dtype=np.int64)
    if keys.size <= n:
        return np.arange(keys.size)
    with np.errstate(over="ignore"):
        h = _mix(keys)
    return np.sort(np.argpartition(h, n - 1)[:n])
