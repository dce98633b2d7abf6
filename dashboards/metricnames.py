"""The metric series the dashboards look for in a run's metric store, and how to find them.

The names are defined once, in :mod:`carls_dask.storage.runfolder` (trainers, makers, paradigms
and the progress sink write them from there), and re-exported here; every one is optional, and a
view shows a message for a series that a run does not write.

A run's progress sink writes each loop's figures as ``LOOP.name`` (``trainer.steps_per_s``,
``pseudo-labeller.pl_precision``) and some of them also without the loop's name; :func:`find_series`
and :func:`first_series` find a series either way, so the views look for the names listed here only.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from carls_dask.storage.runfolder import (
    ACCURACY_BY_DIFFICULTY,
    ADMITTED_FRACTION,
    BANK_LOOKUPS,
    BANK_ROWS,
    BANK_UPDATES,
    DIFFICULTY_HIST,
    PACING,
    PL_COVERAGE,
    PL_PRECISION,
    SAMPLED_FRACTION,
    SCORED_FRACTION,
    STEPS_PER_S,
    TRAIN_LOSS,
    WALL_TIME,
)

__all__ = [
    "ACCURACY_BY_DIFFICULTY",
    "ADMITTED_FRACTION",
    "BANK_LOOKUPS",
    "BANK_ROWS",
    "BANK_UPDATES",
    "DIFFICULTY_HIST",
    "PACING",
    "PL_COVERAGE",
    "PL_PRECISION",
    "SAMPLED_FRACTION",
    "SCORED_FRACTION",
    "STEPS_PER_S",
    "TRAIN_LOSS",
    "WALL_TIME",
    "find_series",
    "first_series",
    "loop_of",
]

def loop_of(series_name: str) -> str:
    """The loop that wrote a series: the part of ``LOOP.name`` before the last dot, ``""`` for an unprefixed one."""
    return series_name.rpartition(".")[0]


def _valid(metrics: xr.Dataset, var: str) -> xr.DataArray | None:
    arr = metrics[var]
    if arr.ndim != 1 or "step" not in arr.dims:
        return None
    arr = arr.dropna("step")
    return arr.astype(np.float64) if arr.sizes["step"] else None


def find_series(metrics: xr.Dataset | None, name: str) -> dict[str, xr.DataArray]:
    """Every 1-D series of the metric store named ``name``, by the loop that wrote it.

    Parameters
    ----------
    metrics
        The run's metric dataset (dimension ``step``), or ``None``.
    name
        An unprefixed name (``"pl_precision"``: every ``LOOP.pl_precision`` series) or one loop's
        series (``"pseudo-labeller.pl_precision"``).

    Returns
    -------
    dict
        Loop name to the series with its missing steps dropped, in the store's order. The unprefixed
        series (key ``""``) is given only when no loop's series of that name exists: the sink writes it
        as a copy of one loop's, so a plot of every loop would draw that loop twice. Series with no
        value are left out; empty when none is found.
    """
    if metrics is None:
        return {}
    if "." in name:
        found = _valid(metrics, name) if name in metrics.data_vars else None
        return {} if found is None else {loop_of(name): found}
    out: dict[str, xr.DataArray] = {}
    for var in metrics.data_vars:
        v = str(var)
        if v.rpartition(".")[2] == name and "." in v and (arr := _valid(metrics, v)) is not None:
            out[loop_of(v)] = arr
    if not out and name in metrics.data_vars and (arr := _valid(metrics, name)) is not None:
        out[""] = arr
    return out


def first_series(metrics: xr.Dataset | None, name: str, prefer: tuple[str, ...] = ("trainer",)) -> xr.DataArray | None:
    """One series named ``name`` (see :func:`find_series`): the unprefixed one, else a ``prefer`` loop's, else the first.

    For figures a run has once (the trainer's speed, the curriculum's pacing), where one line is wanted.
    """
    if metrics is not None and "." not in name and name in metrics.data_vars and (arr := _valid(metrics, name)) is not None:
        return arr
    found = find_series(metrics, name)
    for loop in prefer:
        if loop in found:
            return found[loop]
    return next(iter(found.values()), None)
