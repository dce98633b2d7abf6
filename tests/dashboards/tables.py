"""Build bank-table datasets shaped like ``carls_dask.storage.open_bank`` output, for the dashboard tests."""

from __future__ import annotations

import numpy as np
import xarray as xr


def make_table(
    keys: np.ndarray,
    embedding: np.ndarray,
    *,
    pseudo_label: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
    difficulty: np.ndarray | None = None,
    label: np.ndarray | None = None,
    bucket: np.ndarray | None = None,
    n_shards: int | None = None,
    version: np.ndarray | None = None,
    model_step: np.ndarray | None = None,
    maker: np.ndarray | None = None,
    wall_time: np.ndarray | None = None,
) -> xr.Dataset:
    n = len(keys)
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {"embedding": (("key", "dim"), np.asarray(embedding, np.float32))}
    for name, arr in (
        ("pseudo_label", pseudo_label),
        ("confidence", confidence),
        ("difficulty", difficulty),
        ("label", label),
        ("bucket", bucket),
        ("maker", maker),
    ):
        if arr is not None:
            data[name] = (("key",), np.asarray(arr))
    data["version"] = (("key",), np.ones(n, np.int64) if version is None else np.asarray(version))
    data["model_step"] = (("key",), np.zeros(n, np.int64) if model_step is None else np.asarray(model_step))
    data["wall_time"] = (("key",), np.full(n, 1000.0) if wall_time is None else np.asarray(wall_time, np.float64))
    attrs = {"table": "nodes"}
    if n_shards is not None:
        attrs["n_shards"] = n_shards
    return xr.Dataset(data, coords={"key": np.asarray(keys, np.int64)}, attrs=attrs)
