"""Bank and cluster health: shard sizes, lookup/update rates, staleness, maker versions, trainer speed."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column, shards_of
from carls_dask.errors import InvalidBatchError

__all__ = [
    "bank_parts",
    "bank_summary",
    "counter_rate",
    "counter_rates",
    "maker_versions",
    "reference_time",
    "rows_written_per_second",
    "shard_sizes",
    "staleness",
    "steps_per_second",
]


def shard_sizes(ds: xr.Dataset) -> xr.Dataset:
    """Rows per shard of a snapshot (variable ``rows`` over ``shard``)."""
    s = shards_of(ds)
    ids, counts = np.unique(s, return_counts=True)
    return xr.Dataset({"rows": ("shard", counts)}, coords={"shard": ids})


def _rate(c: np.ndarray, t: np.ndarray, steps: np.ndarray, name: str) -> xr.DataArray | None:
    ok = np.isfinite(c) & np.isfinite(t)
    c, t, steps = c[ok], t[ok], steps[ok]
    if c.size < 2:
        return None
    dt = np.diff(t)
    ok = dt > 0
    rate = np.diff(c)[ok] / dt[ok]
    return xr.DataArray(rate, dims="step", coords={"step": steps[1:][ok]}, name=name)


def counter_rates(metrics: xr.Dataset | None, name: str) -> dict[str, xr.DataArray]:
    """Per-second rate of every loop's cumulative counter ``name`` (see :func:`~carls_dask.dashboards.metricnames.find_series`).

    The rate at a step is the counter's increase since the previous row that has it, divided by the
    time between them (the ``wall_time`` of the rows); the first row has no rate and is dropped, and
    so are rows with no time elapsed. Returns loop name to rate; empty when the run writes no such
    counter or no ``wall_time``.
    """
    if metrics is None or mn.WALL_TIME not in metrics.variables:
        return {}
    wall = metrics[mn.WALL_TIME]
    out = {}
    for loop, arr in mn.find_series(metrics, name).items():
        own = arr.coords[mn.WALL_TIME] if mn.WALL_TIME in arr.coords else wall.sel(step=arr["step"])
        t = np.asarray(own.values, np.float64)
        r = _rate(np.asarray(arr.values, np.float64), t, np.asarray(arr["step"].values), f"{name}_per_s")
        if r is not None:
            out[loop] = r
    return out


def counter_rate(metrics: xr.Dataset | None, name: str) -> xr.DataArray | None:
    """Per-second rate of a cumulative counter series, from the ``wall_time`` series.

    The first loop's, when several loops write ``name`` (see :func:`counter_rates`); ``None`` if the
    run writes no such counter or no ``wall_time``.
    """
    return next(iter(counter_rates(metrics, name).values()), None)


def steps_per_second(metrics: xr.Dataset | None) -> xr.DataArray | None:
    """Trainer steps per second: the trainer's ``steps_per_s`` series if written, else derived from ``wall_time``."""
    if metrics is None:
        return None
    written = mn.first_series(metrics, mn.STEPS_PER_S)
    if written is not None:
        return written
    if mn.WALL_TIME not in metrics.variables:
        return None
    t = np.asarray(metrics[mn.WALL_TIME].values, np.float64)
    steps = np.asarray(metrics["step"].values)
    return _rate(steps.astype(np.float64), t, steps, mn.STEPS_PER_S)


def rows_written_per_second(snapshots: Sequence[xr.Dataset]) -> dict[str, xr.DataArray]:
    """Bank rows written per second between consecutive snapshots, by maker.

    A row of a snapshot counts as written since the previous snapshot when its ``wall_time``
    provenance is newer than every row of the previous one; the count is divided by the time
    between the newest writes of the two snapshots. A row written several times in between counts
    once, so this is the rate of distinct rows (re)written: a lower bound of the write rate.

    Parameters
    ----------
    snapshots
        Snapshots of one table in increasing step order, each with a ``step`` attribute.

    Returns
    -------
    dict
        Maker name (``""`` without ``maker`` provenance) to the rate over the later snapshots' steps;
        empty with fewer than two snapshots carrying ``wall_time``.
    """
    usable = [ds for ds in snapshots if has_column(ds, "wall_time") and ds.sizes.get("key", 0)]
    series: dict[str, tuple[list[int], list[float]]] = {}
    for prev, cur in itertools.pairwise(usable):
        t0 = float(np.nanmax(np.asarray(prev["wall_time"].values, np.float64)))
        t = np.asarray(cur["wall_time"].values, np.float64)
        t1 = float(np.nanmax(t))
        if not t1 > t0:
            continue
        new = t > t0
        makers = np.asarray(cur["maker"].values).astype(str) if has_column(cur, "maker") else np.full(t.size, "")
        step = int(cur.attrs.get("step", -1))
        names = np.unique(makers[new]).tolist() + [m for m in series if m not in makers[new]]
        for m in names:
            steps, rates = series.setdefault(str(m), ([], []))
            steps.append(step)
            rates.append(float((new & (makers == m)).sum()) / (t1 - t0))
    return {
        m: xr.DataArray(np.asarray(r), dims="step", coords={"step": np.asarray(s, np.int64)}, name="rows_per_s")
        for m, (s, r) in sorted(series.items())
    }


def reference_time(now: float, last_write: float | None, finished: bool, idle_s: float) -> float:
    """The time row ages are measured against: ``now`` for a live run, its last write for a finished one.

    A run counts as finished when ``finished`` (it left its result) or when nothing was written for
    ``idle_s`` seconds; its rows then keep the ages they had when it stopped, however long ago that was.

    Parameters
    ----------
    now
        The current unix time.
    last_write
        Unix time of the run's newest write (newest metric row or bank row), ``None`` when unknown.
    finished
        Whether the run has ended.
    idle_s
        Seconds without a write after which a run counts as finished.
    """
    if last_write is None or not np.isfinite(last_write):
        return now
    if finished or now - last_write > idle_s:
        return float(last_write)
    return now


def staleness(ds: xr.Dataset, now: float, bins: int = 20) -> xr.Dataset | None:
    """Distribution of row age (``now - wall_time``, seconds) of a snapshot.

    ``now`` is the reference time (see :func:`reference_time`: the run's last write once it ended).

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


def bank_parts(parts: dict[str, int] | None) -> dict[str, float]:
    """The bank folder's bytes by part as the health figures ``snapshot_mb`` and ``log_mb`` (megabytes, 10^6 bytes;
    NaN without a bank folder), from :func:`carls_dask.storage.bankstore.store_bytes`."""
    if parts is None:
        return {"snapshot_mb": float("nan"), "log_mb": float("nan")}
    return {"snapshot_mb": parts["snapshots"] / 1e6, "log_mb": parts["log"] / 1e6}
