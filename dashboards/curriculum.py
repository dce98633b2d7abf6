"""Curriculum progress: pacing vs realised sampling, difficulty over time, per-difficulty accuracy.

The inputs are the run's metric dataset (dimension ``step``, see :mod:`carls_dask.dashboards.metricnames`) and
bank snapshots whose table has a ``difficulty`` column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import column, has_column
from carls_dask.dashboards.pseudolabels import truth_for
from carls_dask.errors import InvalidBatchError

__all__ = [
    "accuracy_by_difficulty",
    "admitted_fraction",
    "difficulty_histograms",
    "pacing_vs_realised",
]


def pacing_vs_realised(metrics: xr.Dataset | None) -> xr.Dataset | None:
    """The schedule's pacing next to the fraction of data actually admitted, over steps.

    The series are found with or without the loop's name (see
    :func:`~carls_dask.dashboards.metricnames.first_series`).

    Returns
    -------
    xarray.Dataset or None
        Variables ``pacing``, ``realised`` (admitted fraction), ``gap`` (realised - pacing) and, when
        the run writes them, ``sampled`` (fraction of the data drawn so far) and ``scored`` (fraction
        with a difficulty score) over ``step``; ``None`` when the run writes neither pacing nor
        admitted fraction.
    """
    found = {
        var: arr for var, name in (
            ("pacing", mn.PACING), ("realised", mn.ADMITTED_FRACTION),
            ("sampled", mn.SAMPLED_FRACTION), ("scored", mn.SCORED_FRACTION),
        ) if (arr := mn.first_series(metrics, name)) is not None
    }
    if "pacing" not in found and "realised" not in found:
        return None
    out = xr.merge([a.reset_coords(drop=True).rename(v) for v, a in found.items()], join="outer", compat="override")
    for var in ("pacing", "realised"):
        if var not in out:
            out[var] = xr.full_like(out[next(iter(found))], np.nan)
    out["gap"] = out["realised"] - out["pacing"]
    return out


def admitted_fraction(ds: xr.Dataset, pacing: float) -> float:
    """Fraction of a snapshot's rows whose difficulty is within the easiest ``pacing`` share.

    With difficulty scores ranked, a pacing of 0.3 admits the 30% easiest rows; rows whose score
    ties the cut-off are admitted too, so the result can exceed ``pacing`` on ties.
    """
    if not 0.0 <= pacing <= 1.0:
        raise InvalidBatchError(f"admitted_fraction: expected a pacing value in [0, 1], got {pacing}")
    d = np.asarray(column(ds, "difficulty"), dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0 or pacing == 0.0:
        return 0.0
    cut = np.quantile(d, pacing, method="inverted_cdf")
    return float((d <= cut).mean())


def difficulty_histograms(
    snapshots: Sequence[tuple[int, xr.Dataset]], bins: int = 20, value_range: tuple[float, float] | None = None
) -> xr.Dataset | None:
    """Histogram of the ``difficulty`` column of every snapshot, over shared bins.

    Returns
    -------
    xarray.Dataset or None
        ``count`` and ``density`` over ``(step, difficulty)``, or ``None`` if no snapshot has difficulties.
    """
    usable = [(s, np.asarray(ds["difficulty"].values, np.float64)) for s, ds in snapshots if has_column(ds, "difficulty")]
    usable = [(s, d[np.isfinite(d)]) for s, d in usable]
    if not usable:
        return None
    if value_range is None:
        allv = np.concatenate([d for _, d in usable]) if usable else np.zeros(0)
        lo, hi = (float(allv.min()), float(allv.max())) if allv.size else (0.0, 1.0)
        value_range = (lo, hi if hi > lo else lo + 1.0)
    edges = np.linspace(value_range[0], value_range[1], bins + 1)
    counts = np.stack([np.histogram(d, bins=edges)[0] for _, d in usable])
    totals = counts.sum(axis=1, keepdims=True)
    density = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    return xr.Dataset(
        {"count": (("step", "difficulty"), counts), "density": (("step", "difficulty"), density)},
        coords={"step": [s for s, _ in usable], "difficulty": 0.5 * (edges[:-1] + edges[1:])},
    )


def accuracy_by_difficulty(
    ds: xr.Dataset, truth: xr.DataArray | None = None, bins: int = 5, prediction: str = "pseudo_label"
) -> xr.Dataset | None:
    """Accuracy of a prediction column against truth, by difficulty quantile bin.

    Returns
    -------
    xarray.Dataset or None
        ``accuracy`` and ``rows`` over ``difficulty`` (bin centre of each quantile bin), or ``None``
        when the table has no difficulty or prediction column, or there is no truth.
    """
    if not (has_column(ds, "difficulty") and has_column(ds, prediction)):
        return None
    t = truth_for(ds, truth)
    if t is None:
        return None
    d = np.asarray(ds["difficulty"].values, np.float64)
    p = np.asarray(ds[prediction].values, np.int64)
    m = np.isfinite(d) & (t >= 0) & (p >= 0)
    if not m.any():
        return None
    d, p, t = d[m], p[m], t[m]
    edges = np.unique(np.quantile(d, np.linspace(0, 1, bins + 1)))
    if edges.size < 2:
        edges = np.array([d.min(), d.min() + 1.0])
    idx = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, edges.size - 2)
    acc, rows = [], []
    for b in range(edges.size - 1):
        sel = idx == b
        rows.append(int(sel.sum()))
        acc.append(float((p[sel] == t[sel]).mean()) if sel.any() else np.nan)
    return xr.Dataset(
        {"accuracy": ("difficulty", np.array(acc)), "rows": ("difficulty", np.array(rows))},
        coords={"difficulty": 0.5 * (edges[:-1] + edges[1:])},
    )
