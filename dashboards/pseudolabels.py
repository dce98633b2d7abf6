"""Pseudo-label quality: precision and coverage against held-out truth, confidence, flips between makers.

A table with pseudo labels carries the columns ``pseudo_label`` (int, ``-1`` for "no label") and
``confidence`` (float in [0, 1]). Held-out truth comes as an :class:`xarray.DataArray` of int labels
over a ``key`` coordinate (read from the run's ``truth`` file), or as a ``label`` / ``true_label``
column of the table itself; ``-1`` means unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from carls_dask.dashboards.bankdata import column, common_rows, has_column, keys_of
from carls_dask.errors import InvalidBatchError, UnknownColumnError

__all__ = [
    "TRUTH_COLUMNS",
    "QualityIndex",
    "confidence_histogram",
    "flip_rate",
    "has_pseudo_labels",
    "label_quality",
    "per_class_accuracy",
    "threshold_curve",
    "truth_for",
]

#: Columns of a table that, when present, hold held-out truth.
TRUTH_COLUMNS = ("true_label", "label")


def has_pseudo_labels(ds: xr.Dataset) -> bool:
    """Whether the table has a ``pseudo_label`` column with at least one assigned label."""
    if not has_column(ds, "pseudo_label"):
        return False
    return bool((np.asarray(ds["pseudo_label"].values) >= 0).any())


def truth_for(ds: xr.Dataset, truth: xr.DataArray | None = None) -> np.ndarray | None:
    """Held-out truth for every row of ``ds`` (``-1`` where unknown), or ``None`` when there is none."""
    if truth is not None:
        if "key" not in truth.coords:
            raise UnknownColumnError(f"truth: expected a 'key' coordinate, got coords {sorted(map(str, truth.coords))}")
        tk = np.asarray(truth["key"].values, dtype=np.int64)
        tv = np.asarray(truth.values, dtype=np.int64)
        if tk.size > 1 and not bool((tk[1:] >= tk[:-1]).all()):  # a truth file is usually written in key order
            order = np.argsort(tk, kind="stable")
            tk, tv = tk[order], tv[order]
        keys = keys_of(ds)
        pos = np.clip(np.searchsorted(tk, keys), 0, max(tk.size - 1, 0))
        out = np.full(keys.size, -1, dtype=np.int64)
        if tk.size:
            hit = tk[pos] == keys
            out[hit] = tv[pos[hit]]
        return out
    for name in TRUTH_COLUMNS:
        if has_column(ds, name):
            return np.asarray(ds[name].values, dtype=np.int64)
    return None


def _labels(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    pl = np.asarray(column(ds, "pseudo_label"), dtype=np.int64)
    if has_column(ds, "confidence"):
        conf = np.asarray(ds["confidence"].values, dtype=np.float64)
    else:
        conf = np.where(pl >= 0, 1.0, 0.0)
    return pl, conf


@dataclass(frozen=True)
class QualityIndex:
    """The pseudo labels of a table sorted by confidence, so precision and coverage at any threshold are a lookup.

    Built once per table read (:meth:`of`); :meth:`at` then answers a new threshold with two binary
    searches, however many rows the table has, so a threshold widget never re-reads the table.
    """

    rows: int
    #: Confidence of each labelled row, ascending.
    confidence: np.ndarray
    #: ``judged_above[i]``: rows among ``confidence[i:]`` with known truth (length ``n + 1``).
    judged_above: np.ndarray
    #: ``right_above[i]``: rows among ``confidence[i:]`` whose label equals the truth (length ``n + 1``).
    right_above: np.ndarray
    has_truth: bool

    @classmethod
    def of(cls, ds: xr.Dataset, truth: xr.DataArray | None = None) -> QualityIndex:
        """Index the pseudo labels of ``ds`` (truth as in :func:`truth_for`)."""
        pl, conf = _labels(ds)
        t = truth_for(ds, truth)
        lab = pl >= 0
        order = np.argsort(conf[lab], kind="stable")
        c = conf[lab][order]
        if t is None:
            judged = right = np.zeros(c.size, dtype=np.int64)
        else:
            tl, pll = t[lab][order], pl[lab][order]
            judged = (tl >= 0).astype(np.int64)
            right = ((tl >= 0) & (pll == tl)).astype(np.int64)

        def above(x: np.ndarray) -> np.ndarray:
            return np.concatenate([np.cumsum(x[::-1])[::-1], [0]]).astype(np.int64)

        return cls(rows=int(pl.size), confidence=c, judged_above=above(judged), right_above=above(right), has_truth=t is not None)

    def at(self, threshold: float) -> dict[str, float]:
        """Precision and coverage at ``threshold``, as :func:`label_quality` returns them."""
        i = int(np.searchsorted(self.confidence, threshold, side="left"))
        labelled = self.confidence.size - i
        out = {
            "rows": float(self.rows),
            "labelled": float(labelled),
            "coverage": labelled / self.rows if self.rows else np.nan,
        }
        if not self.has_truth:
            out.update(judged=0.0, precision=np.nan)
            return out
        judged = int(self.judged_above[i])
        out["judged"] = float(judged)
        out["precision"] = int(self.right_above[i]) / judged if judged else np.nan
        return out


def label_quality(ds: xr.Dataset, truth: xr.DataArray | None = None, threshold: float = 0.0) -> dict[str, float]:
    """Precision and coverage of the pseudo labels at a confidence threshold.

    Returns
    -------
    dict
        ``coverage``: fraction of rows with a pseudo label of confidence >= ``threshold``;
        ``precision``: fraction of those rows with known truth whose label is right (NaN if none);
        ``labelled``, ``judged``, ``rows``: the counts behind them.
    """
    return QualityIndex.of(ds, truth).at(threshold)


def threshold_curve(
    ds: xr.Dataset, truth: xr.DataArray | None = None, thresholds: np.ndarray | None = None,
    index: QualityIndex | None = None,
) -> xr.Dataset:
    """Precision and coverage as the confidence threshold sweeps ``thresholds`` (default 0, 0.05, ..., 1).

    ``index``: the :class:`QualityIndex` of ``ds`` and ``truth`` when the caller has it already.
    """
    th = np.linspace(0.0, 1.0, 21) if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    index = QualityIndex.of(ds, truth) if index is None else index
    rows = [index.at(float(x)) for x in th]
    return xr.Dataset(
        {
            "precision": ("threshold", np.array([r["precision"] for r in rows])),
            "coverage": ("threshold", np.array([r["coverage"] for r in rows])),
        },
        coords={"threshold": th},
    )


def confidence_histogram(ds: xr.Dataset, truth: xr.DataArray | None = None, bins: int = 20) -> xr.Dataset:
    """Histogram of the confidence of labelled rows on ``[0, 1]``, split into right / wrong / unjudged."""
    if bins < 1:
        raise InvalidBatchError(f"confidence_histogram: expected at least one bin, got {bins}")
    pl, conf = _labels(ds)
    t = truth_for(ds, truth)
    edges = np.linspace(0.0, 1.0, bins + 1)
    lab = pl >= 0
    if t is None:
        t = np.full(pl.size, -1, dtype=np.int64)
    parts = {
        "right": lab & (t >= 0) & (pl == t),
        "wrong": lab & (t >= 0) & (pl != t),
        "unjudged": lab & (t < 0),
    }
    data = {k: ("bin", np.histogram(np.clip(conf[m], 0, 1), bins=edges)[0]) for k, m in parts.items()}
    centres = 0.5 * (edges[:-1] + edges[1:])
    return xr.Dataset(data, coords={"bin": centres})


def per_class_accuracy(ds: xr.Dataset, truth: xr.DataArray | None = None) -> xr.Dataset | None:
    """Per true class: rows with truth, rows labelled, accuracy of their pseudo labels (NaN if none labelled).

    Returns ``None`` when there is no truth.
    """
    pl, _ = _labels(ds)
    t = truth_for(ds, truth)
    if t is None:
        return None
    classes = np.unique(t[t >= 0])
    support, labelled, acc = [], [], []
    for c in classes:
        m = t == c
        lab = m & (pl >= 0)
        support.append(int(m.sum()))
        labelled.append(int(lab.sum()))
        acc.append(float((pl[lab] == c).mean()) if lab.any() else np.nan)
    return xr.Dataset(
        {"support": ("class", np.array(support)), "labelled": ("class", np.array(labelled)), "accuracy": ("class", np.array(acc))},
        coords={"class": classes},
    )


def flip_rate(before: xr.Dataset, after: xr.Dataset) -> dict[str, float]:
    """How many pseudo labels changed between two snapshots (two maker versions).

    Only rows labelled in both snapshots count.

    Returns
    -------
    dict
        ``flip_rate`` (NaN if no row is labelled in both), ``flips``, ``compared``, and ``rewritten``:
        how many of the compared rows the maker rewrote in between (their ``version`` moved).
    """
    _, ia, ib = common_rows(before, after)
    pa = np.asarray(column(before, "pseudo_label"), dtype=np.int64)[ia]
    pb = np.asarray(column(after, "pseudo_label"), dtype=np.int64)[ib]
    both = (pa >= 0) & (pb >= 0)
    flips = int((pa[both] != pb[both]).sum())
    compared = int(both.sum())
    rewritten = compared
    if has_column(before, "version") and has_column(after, "version"):
        va = np.asarray(before["version"].values)[ia][both]
        vb = np.asarray(after["version"].values)[ib][both]
        rewritten = int((va != vb).sum())
    return {
        "flip_rate": flips / compared if compared else float("nan"),
        "flips": float(flips),
        "compared": float(compared),
        "rewritten": float(rewritten),
    }
