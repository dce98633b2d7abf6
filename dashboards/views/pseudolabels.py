"""Pseudo-label quality view: precision / coverage, confidence histogram, per-class accuracy, flips, thresholds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column
from carls_dask.dashboards.figures import LiveBars, LiveCurves, LiveStackedBars
from carls_dask.dashboards.pseudolabels import (
    QualityIndex,
    confidence_histogram,
    flip_rate,
    has_pseudo_labels,
    per_class_accuracy,
    threshold_curve,
    truth_for,
)
from carls_dask.dashboards.views.base import RunView, in_background, series

__all__ = ["PseudoLabelView"]


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


class PseudoLabelView(RunView):
    """How good the makers' pseudo labels are, judged against held-out truth where the run has it."""

    table = param.String(
        default=None, allow_None=True,
        doc="Bank table holding the pseudo labels; None: the reader's table, or the first table with a pseudo_label column.",
    )
    threshold = param.Number(default=0.0, bounds=(0.0, 1.0), doc="Confidence a pseudo label needs to count.")
    bins = param.Integer(default=20, bounds=(2, 200), doc="Bins of the confidence histogram.")
    max_snapshots = param.Integer(default=20, bounds=(2, 10_000), doc="Most recent snapshots in the flip-rate plot.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Pseudo-label quality")
        super().__init__(**params)
        self._flips: dict[int, dict[str, float]] = {}
        self._steps: dict[int, int] = {}
        self.summary = pn.pane.Markdown("", sizing_mode="stretch_width")
        self.threshold_slider = pn.widgets.FloatSlider.from_param(self.param.threshold, step=0.05, width=300)
        # A new threshold is a lookup in the index of the rows shown (answered at once, where the change
        # arrives); new bins recount the histogram in a worker thread (in a served page), updated in place.
        self.param.watch(lambda _e: self._show_summary(), ["threshold"])
        self.param.watch(lambda _e: in_background(self._rejudge, self.flush), ["bins"])
        self._hist = LiveStackedBars("confidence histogram", "no pseudo labels yet", "confidence", name="pl-confidence")
        self._classes = LiveBars("per-class accuracy", "no held-out truth", "class", "accuracy", name="pl-classes")
        self._curve = LiveCurves("threshold curve", "no held-out truth", xlabel="threshold", name="pl-threshold")
        self._flip_plot = LiveCurves(
            "flip rate between maker versions", "needs two snapshots with pseudo labels", ylabel="fraction flipped", name="pl-flips"
        )
        self._series = LiveCurves("precision / coverage reported by the run", "not written by this run", name="pl-series")
        self.quality: dict[str, float] = {}
        self._shown: tuple[xr.Dataset, xr.DataArray | None, bool] | None = None  # what the figures show now
        self._index: QualityIndex | None = None  # the shown rows sorted by confidence

    def _labels(self) -> str | None:
        """The table holding the pseudo labels: :attr:`table` when set; else the reader's table when it has a
        ``pseudo_label`` column, else the first table that has one (a run may keep its pseudo labels in a
        table of their own, e.g. ``pseudo_labels`` beside ``nodes``); ``None`` while no table has one."""
        assert self.reader is not None
        have = [t for t, cols in self.reader.tables().items() if "pseudo_label" in cols]
        if not have:
            return None
        if self.table in have:
            return self.table
        reader_table = self.reader.table
        return reader_table if reader_table in have else have[0]

    def _inputs(self) -> tuple[object, ...]:
        assert self.reader is not None
        table = self._labels()
        latest = self.reader.latest(table) if table is not None else None
        return (latest, self.reader.metrics(), self.reader.truth(), self.threshold, self.bins)

    def _update(self) -> None:
        assert self.reader is not None
        table = self._labels()
        self._update_series()  # the run's own figures show whatever the bank holds
        ds = self.reader.latest(table) if table is not None else None
        if ds is None:
            if self.reader.tables():
                self._set_message("This run has no pseudo labels (no table of its bank has a pseudo_label column).")
            else:
                self._set_absent("No bank yet: pseudo-label quality appears once the run has a bank snapshot.",
                                 "pseudo-label quality")
            return
        if not has_pseudo_labels(ds):
            self._set_message(f"This run has no pseudo labels yet (table {table!r}: no row labelled yet).")
            self.summary.object = ""
            return
        truth = self.reader.truth()
        has_truth = truth_for(ds, truth) is not None
        self._set_message("" if has_truth else "No held-out truth in this run (truth.npz or a label column): precision is not available.")
        self._judge(ds, truth, has_truth)
        self._shown = (ds, truth, has_truth)
        if has_truth:
            acc = per_class_accuracy(ds, truth)
            if acc is not None and acc.sizes.get("class", 0):
                self._classes.set(acc["class"].values, np.nan_to_num(acc["accuracy"].values))
            curve = threshold_curve(ds, truth, index=self._index)  # the index _judge built for these rows
            self._curve.set([series("precision", curve["precision"]), series("coverage", curve["coverage"])])
        self._update_flips()

    def _judge(self, ds: xr.Dataset, truth: xr.DataArray | None, has_truth: bool) -> None:
        """Index the rows read for the summary, and count the confidence histogram at the current bins.

        Takes no lock (a widget change must never wait for a periodic read in a low-priority thread):
        a histogram counted for a bin count that changed meanwhile is dropped, since the change counts
        again with the new one.
        """
        bins = self.bins
        self._index = QualityIndex.of(ds, truth)
        self._show_summary()
        parts = ["right", "wrong", "unjudged"] if has_truth else ["unjudged"]
        hist = confidence_histogram(ds, truth, bins)
        if bins != self.bins:
            return
        self._hist.set(hist["bin"].values, {p: hist[p].values for p in parts})

    def _show_summary(self) -> None:
        """Show precision and coverage of the indexed rows at the current threshold (a lookup: no read)."""
        index, threshold = self._index, self.threshold
        if index is None:
            return
        q = index.at(threshold)
        self.quality = q
        self.summary.object = (
            f"**precision** {_fmt(q['precision'])} &nbsp; **coverage** {_fmt(q['coverage'])} "
            f"&nbsp; labelled rows {int(q['labelled'])} of {int(q['rows'])} (judged {int(q['judged'])}) "
            f"at confidence >= {threshold:.2f}"
        )

    def _rejudge(self) -> None:
        """Count the histogram of the rows shown now at a new bin count, without reading the run again.

        A widget change answers at once this way; the next periodic refresh brings the new rows.
        """
        shown = self._shown
        if shown is None:
            self.read()
        else:
            self._judge(*shown)

    def _update_flips(self) -> None:
        assert self.reader is not None
        table = self._labels()
        snaps = self.reader.snapshots()[-self.max_snapshots :]
        versions = [int(s["version"]) for s in snaps]
        self._steps.update({int(s["version"]): int(s["step"]) for s in snaps})
        for prev, cur in itertools.pairwise(versions):
            if cur in self._flips:
                continue
            try:
                a, b = self.reader.snapshot(prev, table), self.reader.snapshot(cur, table)
            except KeyError:  # a snapshot without the table
                continue
            if has_column(a, "pseudo_label") and has_column(b, "pseudo_label"):
                self._flips[cur] = flip_rate(a, b)
        for v in [v for v in self._flips if v not in versions]:
            del self._flips[v]
        vs = [v for v in versions if v in self._flips and not math.isnan(self._flips[v]["flip_rate"])]
        if vs:
            arr = xr.DataArray([self._flips[v]["flip_rate"] for v in vs], dims="step", coords={"step": [self._steps[v] for v in vs]})
            self._flip_plot.set([series("flip rate", arr)])

    def flips(self) -> dict[int, dict[str, float]]:
        """Flip statistics by the later snapshot's step."""
        return {self._steps[v]: f for v, f in self._flips.items()}

    def _update_series(self) -> None:
        assert self.reader is not None
        m = self.reader.metrics()
        lines = [
            series(f"{loop} {name}" if loop else name, arr)
            for name in (mn.PL_PRECISION, mn.PL_COVERAGE)
            for loop, arr in mn.find_series(m, name).items()
        ]
        if lines:
            self._series.set(lines)

    def applies(self) -> bool:
        """Whether the run has pseudo labels: a ``pseudo_label`` column in a bank table, or pseudo-label series."""
        return self.reader is not None and self.reader.has("pseudo_label", (mn.PL_PRECISION, mn.PL_COVERAGE))

    def _layout(self) -> pn.viewable.Viewable:
        wide = {"sizing_mode": "stretch_width"}
        return pn.Column(
            pn.Row(self.threshold_slider, self.summary, **wide),
            pn.Row(self._hist.pane, self._classes.pane, **wide),
            pn.Row(self._curve.pane, self._flip_plot.pane, **wide),
            self._series.pane,
            **wide,
        )
