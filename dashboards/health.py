"""Bank and cluster health: shard sizes, lookup/update rates, staleness, maker versions, trainer speed."""

from __future__ import annotations

import numpy as np
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column, shards_of
from carls_dask.storage.errors import InvalidBatchError

__all__ = ["bank_summary", "counter_rate", "maker_versions", "shard_sizes", "staleness", "steps_per_second"]


def shard_sizes(ds: xr.Dataset) -> xr.Dataset:
    """Rows per shard of a snapshot (variable ``rows`` over ``shard``)."""
    s = shards_of(ds)
    ids, counts = np.unique(s, return_counts=True)
    return xr.Dataset({"rows": ("shard", counts)}, coords={"shard": ids})


def counter_rate(metrics: xr.Dataset | None, name: str) -> xr.DataArray | None:
    """Per-second rate of a cumulative counter series, from the ``wall_time`` series.

    The rate at a step is the counter's increase since the previous row divided by the time between
    them; the first row has no rate and is dropped. Rows with no time elapsed are dropped too.
    Returns ``None`` if the run writes no such counter or no ``wall_time``.
    """
    if metrics is None or name not in metrics.data_vars or mn.WALL_TIME not in metrics.variables:
        return None
    c = np.asarray(metrics[name].values, np.float64)
    t = np.asarray(metrics[mn.WALL_TIME].values, np.float64)
    steps = np.asarray(metrics["step"].values)
    ok = np.isfinite(c) & np.isfinite(t)
    c, t, steps = c[ok], t[ok], steps[ok]
    if c.size < 2:
        return None
    dt = np.diff(t)
    ok = dt > 0
    rate = np.diff(c)[ok] / dt[ok]
    return xr.DataArray(rate, dims="step", coords={"step": steps[1:][ok]}, name=f"{name}_per_s")


def steps_per_second(metrics: xr.Dataset | None) -> xr.DataArray | None:
    """Trainer steps per second: the ``steps_per_s`` series if written, else derived from ``wall_time``."""
    if metrics is None:
        return None
    if mn.STEPS_PER_S in metrics.data_vars:
        return metrics[mn.STEPS_PER_S].dropna("step").astype(np.float64)
    if mn.WALL_TIME not in metrics.variables:
        return None
    t = np.asarray(metrics[mn.WALL_TIME].values, np.float64)
    steps = np.asarray(metrics["step"].values)
    ok = np.isfinite(t)
    t, steps = t[ok], steps[ok]
    if t.size < 2:
        return None
    dt = np.diff(t)
    ok = dt > 0
    rate = np.diff(steps.astype(np.float64))[ok] / dt[ok]
    return xr.DataArray(rate, dims="step", coords={"step": steps[1:][ok]}, name=mn.STEPS_PER_S)


def staleness(ds: xr.Dataset, now: float, bins: int = 20) -> xr.Dataset | None:
    """Distribution of row age (``now - wall_time``, seconds) of a snapshot.

    Returns
    -------
    xarray.Dataset or None
        ``count`` over ``age`` bin centres, with attrs ``median``, ``p90`` and ``max`` (seconds);
        ``None`` when the table carries no ``wall_time`` provenance or has no rows.
    """
    if bins < 1:
        raise InvalidBatchError(f"staleness: expected at least one bin, got {bins}")
    if not has_column(ds, "wall_time") or ds.sizes.get("key", 0) == 0:
        return None
    age = np.maximum(now - np.asarray(ds["wall_time"].values, np.float64), 0.0)
    age = age[np.isfinite(age)]
    if age.size == 0:
        return None
    hi = float(age.max()) if age.max() > 0 else 1.0
    counts, edges = np.histogram(age, bins=bins, range=(0.0, hi))
    out = xr.Dataset({"count": ("age", counts)}, coords={"age": 0.5 * (edges[:-1] + edges[1:])})
    out.attrs.update(median=float(np.median(age)), p90=float(np.percentile(age, 90)), max=float(age.max()))
    return out


def maker_versions(ds: xr.Dataset) -> xr.Dataset | None:
    """Rows per (maker, model_step) pair: which model versions the bank's knowledge comes from.

    Returns
    -------
    xarray.Dataset or None
        ``rows`` over a ``version`` dimension with ``maker`` and ``model_step`` coordinates, sorted by
        maker then model step; ``None`` without ``model_step`` provenance.
    """
    if not has_column(ds, "model_step"):
        return None
    steps = np.asarray(ds["model_step"].values, np.int64)
    makers = np.asarray(ds["maker"].values).astype(str) if has_column(ds, "maker") else np.full(steps.size, "")
    names, mcode = np.unique(makers, return_inverse=True)
    ustep, scode = np.unique(steps, return_inverse=True)
    pair, rows = np.unique(mcode.astype(np.int64) * max(ustep.size, 1) + scode, return_counts=True)
    return xr.Dataset(
        {"rows": ("version", rows.astype(np.int64))},
        coords={
            "maker": ("version", names[pair // max(ustep.size, 1)].astype(str)),
            "model_step": ("version", ustep[pair % max(ustep.size, 1)].astype(np.int64)),
        },
    )


def bank_summary(ds: xr.Dataset | None) -> dict[str, float]:
    """Headline numbers of a bank table: ``rows``, newest ``version``, ``model_step`` and ``wall_time``."""
    if ds is None or ds.sizes.get("key", 0) == 0:
        return {"rows": 0.0, "version": float("nan"), "model_step": float("nan"), "wall_time": float("nan")}
    out = {"rows": float(ds.sizes["key"])}
    for name in ("version", "model_step", "wall_time"):
        out[name] = float(np.nanmax(np.asarray(ds[name].values, np.float64))) if has_column(ds, name) else float("nan")
    return out
